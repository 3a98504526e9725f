"""Builds the pspnode wheel (the metadata is in pyproject.toml).

With a pspnode binary at pspnode/bin/ (``make dist`` and ``make wheel`` put
the static one there), the wheel is a platform wheel that carries it,
tagged py3-none-PLATFORM ($PSPNODE_WHEEL_PLATFORM, e.g.
manylinux2014_x86_64, or this machine's): ``pip install`` then gives the
client the binary it starts. Without one, it is a pure wheel whose client
finds the binary on $PSPNODE_BIN or PATH.
"""

import os

from setuptools import Distribution, setup

HERE = os.path.dirname(os.path.abspath(__file__))
BUNDLED = any(os.path.isfile(os.path.join(HERE, "pspnode", "bin", n)) for n in ("pspnode", "pspnode.exe"))

cmdclass, options = {}, {}
try:
    from wheel.bdist_wheel import bdist_wheel as _bdist_wheel
except ImportError:  # setuptools 70.1 and later carry it
    try:
        from setuptools.command.bdist_wheel import bdist_wheel as _bdist_wheel
    except ImportError:
        _bdist_wheel = None

if BUNDLED and _bdist_wheel is not None:
    class bdist_wheel(_bdist_wheel):
        """A platform wheel (it carries a binary of that platform) for any
        Python 3: py3-none-PLATFORM."""

        def finalize_options(self):
            plat = os.environ.get("PSPNODE_WHEEL_PLATFORM")
            if plat:
                self.plat_name = plat
            super().finalize_options()

        def get_tag(self):
            _, _, plat = super().get_tag()
            return "py3", "none", plat

    class BinaryDistribution(Distribution):
        """A distribution with a platform's file in it: installed where
        platform-specific modules go, in a wheel of that platform."""

        def has_ext_modules(self):
            return True

    cmdclass["bdist_wheel"] = bdist_wheel
    options["distclass"] = BinaryDistribution

setup(cmdclass=cmdclass, **options)
