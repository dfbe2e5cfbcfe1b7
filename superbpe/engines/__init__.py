"""The engines that count, train and encode (python, and native over ``superbpe._native``) behind one
interface; built on :mod:`superbpe.core` alone."""
