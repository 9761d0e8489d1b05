"""The source trees of the lab's git stand-ins (``git_repositories`` of repo_packages.yml),
one per repository: what a role builds on a lab node, with the real build's commands and the
real build's checks, compiling nothing. ``make`` installs launchers of the lab simulator.

- nccl-tests: NVIDIA/nccl-tests' Makefile variables (``make MPI=1 MPI_HOME=... CUDA_HOME=...
  NCCL_HOME=...``), binaries in ``build/``.
- perftest: linux-rdma/perftest's autotools build (``./autogen.sh && ./configure
  --prefix=... CUDA_H_PATH=.../cuda.h && make && make install``), binaries in ``<prefix>/bin``;
  launchers that run the simulator's ``<tool>+cuda`` handlers where configure found cuda.h.

repo.py writes a tree into a git repository; this module only says what is in it.
"""

from __future__ import annotations

from collections.abc import Callable

# relative path -> (text, mode)
Tree = dict[str, tuple[str, int]]
# the launcher of the lab simulator: (tool, suffix of the simulator's handler name) -> script
Launcher = Callable[[str, str], str]


def source_tree(
    name: str, bins: tuple[str, ...], source: str, notice: str, launcher: Launcher
) -> Tree:
    """The files of the stand-in ``name`` (a repository of repo_packages.yml; ``source``: where
    the real one is)."""
    if name == "nccl-tests":
        return _nccl_tests(name, bins, source, notice, launcher)
    if name == "perftest":
        return _perftest(name, bins, source, notice, launcher)
    raise ValueError(f"no stand-in source tree for git repository {name!r}")


# ------------------------------------------------------------------------------------------
# nccl-tests


def nccl_tests_makefile(bins: tuple[str, ...], notice: str) -> str:
    """The stand-in's Makefile: nccl-tests' make variables, checked as a real build needs them.

    NVIDIA/nccl-tests README: ``make MPI=1 MPI_HOME=/path/to/mpi CUDA_HOME=/path/to/cuda
    NCCL_HOME=/path/to/nccl``, binaries in ``./build`` (BUILDDIR). A real build needs
    $(CUDA_HOME)/bin/nvcc, $(MPI_HOME)/include/mpi.h with MPI=1 and $(NCCL_HOME)/include/nccl.h;
    this one checks the same files, compiles nothing and installs the simulator's launcher under
    each test's name.
    """
    return (
        f"# nccl-tests: {notice} (not NVIDIA/nccl-tests).\n"
        "# Same make variables as https://github.com/NVIDIA/nccl-tests; nothing is compiled.\n"
        "BUILDDIR ?= build\n"
        "CUDA_HOME ?= /usr/local/cuda\n"
        "MPI ?= 0\n"
        "MPI_HOME ?=\n"
        "NCCL_HOME ?=\n"
        f"BINS := {' '.join(bins)}\n\n"
        "all: $(addprefix $(BUILDDIR)/,$(BINS))\n\n"
        "check:\n"
        '\t@test -x "$(CUDA_HOME)/bin/nvcc" || '
        '{ echo "nvcc not found: $(CUDA_HOME)/bin/nvcc (set CUDA_HOME)" >&2; exit 1; }\n'
        "ifeq ($(MPI),1)\n"
        '\t@test -f "$(MPI_HOME)/include/mpi.h" || '
        '{ echo "mpi.h not found: $(MPI_HOME)/include/mpi.h (set MPI_HOME)" >&2; exit 1; }\n'
        "endif\n"
        "ifneq ($(NCCL_HOME),)\n"
        '\t@test -f "$(NCCL_HOME)/include/nccl.h" || '
        '{ echo "nccl.h not found: $(NCCL_HOME)/include/nccl.h (set NCCL_HOME)" >&2; exit 1; }\n'
        "endif\n\n"
        "$(BUILDDIR)/%: src/launcher.py | check\n"
        "\t@mkdir -p $(BUILDDIR)\n"
        "\tinstall -m 0755 $< $@\n\n"
        "clean:\n"
        "\trm -rf $(BUILDDIR)\n\n"
        ".PHONY: all check clean\n"
    )


def _nccl_tests(
    name: str, bins: tuple[str, ...], source: str, notice: str, launcher: Launcher
) -> Tree:
    return {
        "Makefile": (nccl_tests_makefile(bins, notice), 0o644),
        "src/launcher.py": (launcher(name, ""), 0o755),
        "README.md": (
            f"# {name} ({notice})\n\nServed to lab nodes only; {source}\n"
            "`make MPI=1 MPI_HOME=... CUDA_HOME=... NCCL_HOME=...` writes launchers of the lab "
            "simulator into build/.\n",
            0o644,
        ),
    }


# ------------------------------------------------------------------------------------------
# perftest

# linux-rdma/perftest's autogen.sh: libtoolize --force --copy; aclocal -I config; autoheader;
# automake --foreign --add-missing --copy; autoconf
_AUTOTOOLS = ("libtoolize", "aclocal", "autoheader", "automake", "autoconf")


def perftest_autogen(notice: str) -> str:
    """autogen.sh: the autotools the real one runs must be installed; it writes configure."""
    return (
        "#! /bin/sh\n"
        f"# perftest autogen.sh: {notice} (not linux-rdma/perftest).\n"
        f"# The real one runs {', '.join(_AUTOTOOLS)} to write configure; this one checks\n"
        "# that they are installed and puts the stand-in's configure in place.\n"
        f"for tool in {' '.join(_AUTOTOOLS)}; do\n"
        '    command -v "$tool" >/dev/null 2>&1 || '
        '{ echo "./autogen.sh: $tool: not found" >&2; exit 127; }\n'
        "done\n"
        "cp standin/configure configure\n"
        "chmod 0755 configure\n"
    )


def perftest_configure(notice: str) -> str:
    """configure: the checks of perftest 25.10's configure.ac that a node can fail, with its
    error messages; cuda.h found as that release finds it (/usr/local/cuda/include/cuda.h, then
    CUDA_H_PATH where that file exists) and, as there, no error without one: config.h then has
    no HAVE_CUDA and the launchers run the simulator's tools without CUDA. CPPFLAGS' -I and
    LDFLAGS' -L directories are searched first, as the compiler would."""
    return (
        "#! /bin/sh\n"
        f"# perftest configure: {notice} (not linux-rdma/perftest).\n"
        "# The checks of perftest 25.10's configure.ac that a node can fail; nothing is compiled.\n"
        'prefix=/usr  # AC_PREFIX_DEFAULT("/usr")\n'
        'for arg in "$@"; do\n'
        '    case "$arg" in\n'
        '        --prefix=*) prefix="${arg#--prefix=}" ;;\n'
        '        CUDA_H_PATH=*) CUDA_H_PATH="${arg#CUDA_H_PATH=}" ;;\n'
        '        CPPFLAGS=*) CPPFLAGS="${arg#CPPFLAGS=}" ;;\n'
        '        LDFLAGS=*) LDFLAGS="${arg#LDFLAGS=}" ;;\n'
        "        --*|*=*) ;;\n"
        "        *) echo \"configure: error: invalid variable name: '$arg'\" >&2; exit 1 ;;\n"
        "    esac\n"
        "done\n"
        'error() { echo "configure: error: $*" >&2; exit 1; }\n'
        "dirs() {  # the directories of one flag (-I or -L) in a flags variable\n"
        '    for word in $2; do case "$word" in "$1"*) echo "${word#"$1"}" ;; esac; done\n'
        "}\n"
        "header() {\n"
        "    # Debian's multiarch directory too: libpci-dev's pci/pci.h is under it\n"
        '    for d in $(dirs -I "$CPPFLAGS") /usr/local/include /usr/include/*-linux-gnu \\\n'
        "             /usr/include; do\n"
        '        test -f "$d/$1" && return 0\n'
        "    done\n"
        "    return 1\n"
        "}\n"
        "library() {\n"
        '    for d in $(dirs -L "$LDFLAGS") /usr/local/lib /usr/lib64 \\\n'
        "             /usr/lib/*-linux-gnu /usr/lib; do\n"
        '        test -e "$d/lib$1.so" && return 0\n'
        "    done\n"
        "    return 1\n"
        "}\n"
        'echo "checking for gcc..."\n'
        "command -v gcc >/dev/null 2>&1 || command -v cc >/dev/null 2>&1 || "
        "error 'no acceptable C compiler found in $PATH'\n"
        'echo "checking for infiniband/verbs.h..."\n'
        'header infiniband/verbs.h || error "ibverbs header files not found"\n'
        'echo "checking for ibv_get_device_list in -libverbs..."\n'
        'library ibverbs || error "libibverbs not found"\n'
        'echo "checking for rdma_create_event_channel in -lrdmacm..."\n'
        'library rdmacm || error "librdmacm-devel not found"\n'
        'echo "checking for umad_init in -libumad..."\n'
        'library ibumad || error "libibumad not found"\n'
        'echo "checking for pci/pci.h..."\n'
        "header pci/pci.h || "
        'error "pciutils header files not found, consider installing pciutils-devel"\n'
        'echo "checking for pci_init in -lpci..."\n'
        'library pci || error "libpci not found"\n'
        "printf 'checking for CUDA header file... '\n"
        "cuda_h_path=\n"
        "test -f /usr/local/cuda/include/cuda.h && cuda_h_path=/usr/local/cuda/include/cuda.h\n"
        'test -f "$CUDA_H_PATH" && cuda_h_path="$CUDA_H_PATH"\n'
        'if test -n "$cuda_h_path"; then echo "found at $cuda_h_path"; else echo no; fi\n'
        "{\n"
        f'    echo "/* config.h: {notice} */"\n'
        "    echo '#define PACKAGE_VERSION \"6.27\"'\n"
        '    if test -n "$cuda_h_path"; then\n'
        "        echo '#define HAVE_CUDA 1'\n"
        '        echo "#define CUDA_PATH \\"$cuda_h_path\\""\n'
        "    fi\n"
        "} > config.h\n"
        "launcher=standin/launcher.py\n"
        'test -n "$cuda_h_path" && launcher=standin/launcher-cuda.py\n'
        'sed -e "s|@prefix@|$prefix|" -e "s|@LAUNCHER@|$launcher|" standin/Makefile.in > Makefile\n'
        'echo "config.status: creating Makefile"\n'
        'echo "config.status: creating config.h"\n'
    )


def perftest_makefile_in(bins: tuple[str, ...], notice: str) -> str:
    """Makefile.in: ``make`` copies the launcher under each tool's name, ``make install`` puts
    them in <prefix>/bin, as perftest's bin_PROGRAMS."""
    return (
        f"# perftest Makefile: {notice} (not linux-rdma/perftest).\n"
        "# Written by configure; nothing is compiled.\n"
        "prefix = @prefix@\n"
        "bindir = $(prefix)/bin\n"
        "LAUNCHER = @LAUNCHER@\n"
        f"BINS = {' '.join(bins)}\n\n"
        "all: $(BINS)\n\n"
        "$(BINS): $(LAUNCHER) config.h\n"
        "\tinstall -m 0755 $(LAUNCHER) $@\n\n"
        "install: all\n"
        "\tmkdir -p $(DESTDIR)$(bindir)\n"
        "\tfor b in $(BINS); do install -m 0755 $$b $(DESTDIR)$(bindir)/$$b; done\n\n"
        "clean:\n"
        "\trm -f $(BINS)\n\n"
        ".PHONY: all install clean\n"
    )


def _perftest(
    name: str, bins: tuple[str, ...], source: str, notice: str, launcher: Launcher
) -> Tree:
    return {
        "autogen.sh": (perftest_autogen(notice), 0o755),
        "standin/configure": (perftest_configure(notice), 0o755),
        "standin/Makefile.in": (perftest_makefile_in(bins, notice), 0o644),
        "standin/launcher-cuda.py": (launcher(name, "+cuda"), 0o755),
        "standin/launcher.py": (launcher(name, ""), 0o755),
        "README": (
            f"perftest ({notice})\n\nServed to lab nodes only; {source}\n"
            "./autogen.sh && ./configure --prefix=DIR CUDA_H_PATH=.../include/cuda.h && make && "
            "make install\nchecks what a real build needs, compiles nothing and installs "
            "launchers of the lab simulator into DIR/bin (with cuda.h: its <tool>+cuda "
            "handlers).\n",
            0o644,
        ),
    }
