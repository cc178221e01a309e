"""The parts of the sandbox one at a time: the ``Sandbox`` checks, the account decision, what
the machine supports, the Landlock rights per ABI, and removing a scratch directory a job
filled with traps. The whole, with real jobs, is in tests/reliability/test_sandbox.py."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from zett_agent.process import Sandbox, sandbox_support
from zett_agent.process._sandbox import _caps, _landlock, _scratch
from zett_agent.process._sandbox import _options as _sandbox


@pytest.mark.parametrize(
    ("kwargs", "error", "words"),
    [
        ({"read": "/etc"}, TypeError, "list of paths"),
        ({"read": [1]}, TypeError, "str or os.PathLike"),
        ({"write": ["relative/dir"]}, ValueError, "absolute"),
        ({"network": "some"}, ValueError, "one of none, all"),
        ({"network": None}, TypeError, "one of none, all"),
        ({"env": ["A=1"]}, TypeError, "mapping"),
        ({"env": {"A": 1}}, TypeError, "map str to str"),
        ({"env": {"A=B": "1"}}, ValueError, "invalid variable"),
        ({"user": True}, TypeError, "uid"),
        ({"user": -1}, ValueError, "uid from 0"),
        ({"user": ""}, ValueError, "account name"),
        ({"required": "yes"}, TypeError, "True or False"),
    ],
)
def test_a_bad_sandbox_is_refused_at_construction(
    kwargs: dict[str, object], error: type[Exception], words: str
) -> None:
    with pytest.raises(error, match=words):
        Sandbox(**kwargs)  # type: ignore[arg-type]


def test_a_sandbox_keeps_normalized_copies(tmp_path: Path) -> None:
    env = {"A": "1"}
    sandbox = Sandbox(read=[tmp_path / "a" / ".." / "b"], write=[str(tmp_path)], env=env)
    env["A"] = "2"
    assert sandbox.read == (str(tmp_path / "b"),) and sandbox.write == (str(tmp_path),)
    assert sandbox.env == {"A": "1"}
    assert Sandbox() == Sandbox(network="none", required=True)


def test_user_is_refused_on_a_host_that_is_not_root(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_sandbox, "_privileged", lambda: False)
    with pytest.raises(ValueError, match="needs a host running as root"):
        _sandbox.resolve_account(0)
    account = _sandbox.resolve_account(None)
    assert account.mode == "same" and account.uid == os.geteuid()


@pytest.mark.skipif(os.geteuid() != 0, reason="the account decision is a root host's")
def test_the_account_follows_what_can_run_the_interpreter() -> None:
    problem = _sandbox.interpreter_problem(65534, 65534)
    default = _sandbox.resolve_account(None)
    if problem is None:
        assert default.mode == "user" and default.uid == 65534
        assert _sandbox.resolve_account(65534).mode == "user"
    else:
        # an account that cannot run the interpreter: the default falls back, and saying so
        assert default.mode == "root" and default.uid == 0 and "65534" in (default.why or "")
        with pytest.raises(ValueError, match="cannot run the interpreter"):
            _sandbox.resolve_account(65534)
    assert _sandbox.resolve_account(0).mode == "root"
    with pytest.raises(ValueError, match="no such account"):
        _sandbox.resolve_account("zett-no-such-account")


def test_blocked_walks_every_component_for_the_account() -> None:
    top = Path(tempfile.mkdtemp())  # the temporary directory: traversable by every account
    try:
        os.chmod(top, 0o755)
        inner = top / "closed" / "open"
        inner.mkdir(parents=True)
        (inner / "mod.py").write_text("")
        os.chmod(top / "closed", 0o700)
        uid = os.geteuid() + 12345  # an account that owns none of it
        problem = _sandbox._blocked(str(inner / "mod.py"), uid, uid, False)
        assert problem is not None and f"{top}/closed is mode 0700" in problem, problem
        os.chmod(top / "closed", 0o755)
        assert _sandbox._blocked(str(inner / "mod.py"), uid, uid, False) is None
        os.chmod(inner / "mod.py", 0o600)
        problem = _sandbox._blocked(str(inner / "mod.py"), uid, uid, False)
        assert problem is not None and "cannot read it" in problem, problem
    finally:
        shutil.rmtree(top)


def test_sandbox_support_says_what_this_machine_enforces() -> None:
    support = sandbox_support()
    assert set(support) == {
        "landlock_abi",
        "seccomp",
        "can_change_user",
        "default_user",
        "namespaces",
        "required_ok",
        "reasons",
    }
    assert support["namespaces"] is ("namespaces" not in support["reasons"])
    if os.geteuid() == 0 and _caps.has(_caps.CAP_SYS_ADMIN):
        assert support["namespaces"] is True  # root makes a job's namespaces itself
    version, why = _landlock.abi()
    assert support["landlock_abi"] == version
    assert support["required_ok"] == (version >= 6 and support["seccomp"])
    if why is not None:
        assert support["reasons"]["landlock"] == why
    if not support["can_change_user"]:
        assert "not as root" in support["reasons"]["can_change_user"]


def test_landlock_rights_grow_with_the_abi() -> None:
    assert _landlock.fs_rights(0) == 0
    assert _landlock.fs_rights(1) == (1 << 13) - 1
    assert _landlock.fs_rights(2) & _landlock.ACCESS_FS_REFER
    assert not _landlock.fs_rights(2) & _landlock.ACCESS_FS_TRUNCATE
    assert _landlock.fs_rights(3) & _landlock.ACCESS_FS_TRUNCATE
    assert _landlock.fs_rights(5) == (1 << 16) - 1
    # making device files is never granted, not even in the scratch directory
    assert not _landlock.write_rights(7) & (_landlock.ACCESS_FS_MAKE_CHAR | 1 << 11)
    assert _landlock.read_rights(7) == 0b1101  # execute, read file, read dir


@pytest.mark.skipif(_landlock.abi()[0] < 1, reason="no Landlock here")
def test_a_ruleset_confines_only_the_process_that_enters_it(tmp_path: Path) -> None:
    (tmp_path / "in").mkdir()
    code = (
        "import sys; sys.path[:0] = [sys.argv[1]]\n"
        "from zett_agent.process._sandbox import _landlock\n"
        "v = _landlock.abi()[0]; r = _landlock.Ruleset(v, fs=True, tcp=False, scoped=False)\n"
        "r.allow(sys.argv[2], _landlock.write_rights(v)); r.allow('/', _landlock.read_rights(v))\n"
        "_landlock.set_no_new_privs(); r.restrict_self(); r.close()\n"
        "open(sys.argv[2] + '/ok', 'w').write('x')\n"
        "try:\n    open(sys.argv[3], 'w')\nexcept PermissionError:\n    print('denied')\n"
    )
    src = os.path.dirname(os.path.dirname(os.path.dirname(_landlock.__file__)))
    out = subprocess.run(
        [sys.executable, "-c", code, src, str(tmp_path / "in"), str(tmp_path / "out")],
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.strip() == "denied", out.stderr
    assert (tmp_path / "in" / "ok").exists() and not (tmp_path / "out").exists()
    (tmp_path / "out").write_text("this process is not confined")


def test_removing_a_scratch_directory_never_follows_what_the_job_planted(
    tmp_path: Path,
) -> None:
    victim_dir = tmp_path / "victim"
    victim_dir.mkdir()
    (victim_dir / "keep.txt").write_text("must survive")
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    (scratch / "link-to-dir").symlink_to(victim_dir)
    (scratch / "link-to-file").symlink_to(victim_dir / "keep.txt")
    (scratch / "sub").mkdir()
    (scratch / "sub" / "link").symlink_to(victim_dir)
    locked = scratch / "locked"
    locked.mkdir()
    (locked / "file").write_text("x")
    locked.chmod(0)
    # deep: more levels than a recursive removal or one descriptor per level could take
    fd = os.open(scratch, os.O_RDONLY)
    for _ in range(1500):
        os.mkdir("d", dir_fd=fd)
        inner = os.open("d", os.O_RDONLY, dir_fd=fd)
        os.close(fd)
        fd = inner
    os.close(fd)
    assert _scratch.remove_tree(str(scratch))
    assert not scratch.exists()
    assert (victim_dir / "keep.txt").read_text() == "must survive"
    assert _scratch.remove_tree(str(scratch))  # gone already: nothing to do


def test_a_removal_stops_when_asked(tmp_path: Path) -> None:
    scratch = tmp_path / "scratch"
    (scratch / "a" / "b").mkdir(parents=True)
    assert not _scratch.remove_tree(str(scratch), stop=lambda: True)
    assert scratch.exists()
    assert _scratch.remove_tree(str(scratch))


def test_a_sweep_neither_hangs_on_nor_takes_a_lock_file_a_job_planted(tmp_path: Path) -> None:
    """A job of the same account can make directories named like a pool's base: one whose lock
    file is a FIFO (an open() for reading would wait for a writer for good, in the janitor),
    a symlink to a free lock, or a directory. None is judged stale; the real stale base is."""
    real = tmp_path / "real-lock"
    real.touch()
    for kind in ("fifo", "link", "dir"):
        base = tmp_path / f"{_scratch.PREFIX}{kind}"
        base.mkdir()
        lock = base / ".lock"
        if kind == "fifo":
            os.mkfifo(lock)
        elif kind == "link":
            lock.symlink_to(real)
        else:
            lock.mkdir()
    dead = _scratch.Base()
    dead.close()
    try:
        moved = tmp_path / os.path.basename(dead.path)
        os.rename(dead.path, moved)
        assert _scratch.stale_bases(str(tmp_path)) == [str(moved)]
    finally:
        _scratch.remove_tree(dead.path)


def test_a_base_whose_pool_is_gone_is_found_stale(tmp_path: Path) -> None:
    live = _scratch.Base()
    dead = _scratch.Base()
    try:
        dead.close()  # its pool's host died: nobody holds the lock
        stale = _scratch.stale_bases()
        assert dead.path in stale and live.path not in stale
        assert os.stat(live.path).st_mode & 0o777 == 0o711
    finally:
        live.close()
        for base in (live, dead):
            _scratch.remove_tree(base.path)


_FILE_SETATTR = 469  # Linux 6.17, the highest number the filter reviewed (REVIEWED)


def _file_setattr_errno(reviewed: int | None) -> str:
    """The errno ``file_setattr`` with bad arguments meets in a fresh interpreter, under the
    filter built with ``reviewed`` (``None``: no filter)."""
    code = (
        "import sys, ctypes, errno; sys.path[:0] = [sys.argv[1]]\n"
        "from zett_agent.process._sandbox import _landlock, _seccomp\n"
        "if sys.argv[2] != 'none':\n"
        "    _landlock.set_no_new_privs()\n"
        "    _seccomp.load(_seccomp.program('none', True, int(sys.argv[2])))\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        f"libc.syscall({_FILE_SETATTR}, -1, None, None, 0, 0)\n"
        "print(errno.errorcode[ctypes.get_errno()])\n"
    )
    src = os.path.dirname(os.path.dirname(os.path.dirname(_landlock.__file__)))
    out = subprocess.run(
        [sys.executable, "-c", code, src, "none" if reviewed is None else str(reviewed)],
        capture_output=True,
        text=True,
        check=True,
    )
    return out.stdout.strip()


def test_a_system_call_newer_than_the_filter_knows_is_not_allowed_unseen() -> None:
    """The filter's bound: a call numbered above ``REVIEWED`` fails with ENOSYS, as on a kernel
    without it. Watched on ``file_setattr`` by lowering the bound just below it."""
    from zett_agent.process._sandbox import _seccomp

    if os.uname().machine not in ("x86_64", "aarch64"):
        pytest.skip("the bound is for x86_64 and aarch64")
    if not _seccomp.available()[0]:
        pytest.skip("no seccomp here")
    unfiltered = _file_setattr_errno(None)
    if unfiltered == "ENOSYS":
        pytest.skip("this kernel has no file_setattr (Linux 6.17)")
    assert _seccomp.REVIEWED >= _FILE_SETATTR
    assert _file_setattr_errno(_seccomp.REVIEWED) == unfiltered  # reviewed: the kernel answers
    assert _file_setattr_errno(_FILE_SETATTR - 1) == "ENOSYS"  # above the bound: never reached
