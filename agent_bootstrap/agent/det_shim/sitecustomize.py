"""Put on a task's PYTHONPATH by the Shipyard agent (shipyard_common/determined_info.py says why).

When the task imports Determined's package (`determined`, 0.38.x), point it at this task's info
files instead of the fixed `/run/determined/info/`, at the shared_fs storage's host path
instead of the container mount `/determined_shared_fs` (there is no container), and its launcher's
pid server socket into the task's directory instead of the host's /tmp, and give TensorBoard's
AUTO mode a writer when neither TensorFlow nor torch's is installed. Only the default arguments,
a constant and that fallback change; nothing is imported that the task does not import itself
(the harness's writer only when the fallback is taken).
In a container of an agent with `container_harness_libs`, append the directory of the harness's
libraries for this Python (SHIPYARD_FALLBACK_SITE) to sys.path, after the image's own packages.
Then run the environment's own `sitecustomize`, if it has one.
"""

import importlib.abc
import importlib.util
import json
import os
import sys

_DIR = os.environ.get("SHIPYARD_DET_INFO_DIR")


def _patch_info(module):  # type: ignore[no-untyped-def]
    paths = {name: os.path.join(_DIR, f"{name}.json") for name in ("cluster", "trial", "rendezvous", "resources")}
    for cls_name, key in (("ClusterInfo", "cluster"), ("TrialInfo", "trial"), ("RendezvousInfo", "rendezvous"),
                          ("ResourcesInfo", "resources")):
        cls = getattr(module, cls_name, None)
        for meth in ("_from_file", "_to_file"):
            fn = getattr(cls, meth, None) if cls is not None else None
            fn = getattr(fn, "__func__", fn)
            if fn is not None and fn.__defaults__:
                fn.__defaults__ = (paths[key],) + fn.__defaults__[1:]
    for key, path in paths.items():
        const = f"DEFAULT_{key.upper()}_INFO_PATH"
        if hasattr(module, const):
            setattr(module, const, path)


def _patch_constants(module):  # type: ignore[no-untyped-def]
    try:
        with open(os.path.join(_DIR, "trial.json")) as f:
            storage = (json.load(f).get("config") or {}).get("checkpoint_storage") or {}
    except (OSError, ValueError):
        return
    if storage.get("type") == "shared_fs" and storage.get("host_path") and hasattr(module, "SHARED_FS_CONTAINER_PATH"):
        module.SHARED_FS_CONTAINER_PATH = storage["host_path"]


def _patch_ipc(module):  # type: ignore[no-untyped-def]
    """Determined's torch_distributed launcher puts its pid server's socket at the fixed
    `/tmp/pid_server-<allocation id>` (a container's own /tmp). The parts of one trial on one host
    would share it: move it into this task's private directory (relative to the task's working
    directory, where the launcher and its workers run, when the absolute path is too long for a
    unix socket)."""
    read = getattr(module, "read_pid_server_addr", None)
    if read is None:
        return

    def read_pid_server_addr(addr):  # type: ignore[no-untyped-def]
        out = read(addr)
        if isinstance(out, str) and out.startswith("/tmp/pid_server-"):
            path = os.path.join(_DIR, "pid_server.sock")
            if len(path.encode()) > 100:
                path = os.path.relpath(path)
            return path
        return out

    module.read_pid_server_addr = read_pid_server_addr


def _patch_tensorboard(module):  # type: ignore[no-untyped-def]
    """`core.init()` in TensorboardMode AUTO (its default) asks `get_metric_writer()` for
    TensorFlow's writer, else torch's, and fails when the interpreter has neither (with the
    `tensorboard` package). Fall back to the harness's own tfevents writer (standard library only,
    shipped beside this shim); Determined's TensorboardManager syncs its files as usual."""
    original = getattr(module, "get_metric_writer", None)
    if original is None:
        return

    def get_metric_writer():  # type: ignore[no-untyped-def]
        try:
            return original()
        except ImportError as missing:
            try:
                from harness.tensorboard.determined_compat import metric_writer
            except ImportError:
                raise missing from None
            return metric_writer()

    module.get_metric_writer = get_metric_writer


_PATCHES = {"determined._info": _patch_info, "determined.common.constants": _patch_constants,
            "determined.ipc": _patch_ipc, "determined.tensorboard.base": _patch_tensorboard}


class _Loader(importlib.abc.Loader):
    def __init__(self, inner, patch):  # type: ignore[no-untyped-def]
        self.inner = inner
        self.patch = patch

    def create_module(self, spec):  # type: ignore[no-untyped-def]
        return self.inner.create_module(spec)

    def exec_module(self, module):  # type: ignore[no-untyped-def]
        self.inner.exec_module(module)
        self.patch(module)


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path, target=None):  # type: ignore[no-untyped-def]
        patch = _PATCHES.get(fullname)
        if patch is None:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None and spec.loader is not None:
                spec.loader = _Loader(spec.loader, patch)
                return spec
        return None


if _DIR:
    sys.meta_path.insert(0, _Finder())

# The docker runtime's container_harness_libs (agent/runtime/harness_libs.py): the harness's
# libraries for this Python, last on the path, so the image's own packages come first.
_LIBS = os.environ.get("SHIPYARD_FALLBACK_SITE")
if _LIBS and os.path.isdir(_LIBS) and _LIBS not in sys.path:
    sys.path.append(_LIBS)


def _chain() -> None:
    """The interpreter imports only the first `sitecustomize` on sys.path: this one. Run the next."""
    here = os.path.dirname(os.path.abspath(__file__))
    for entry in sys.path:
        if os.path.abspath(entry or os.getcwd()) == here:
            continue
        candidate = os.path.join(entry or os.getcwd(), "sitecustomize.py")
        if os.path.isfile(candidate):
            spec = importlib.util.spec_from_file_location("_shipyard_next_sitecustomize", candidate)
            if spec is not None and spec.loader is not None:
                spec.loader.exec_module(importlib.util.module_from_spec(spec))
            return


_chain()
