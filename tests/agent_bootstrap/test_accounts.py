"""The task's account inside its container (agent_bootstrap/agent/runtime/accounts.py)."""

from __future__ import annotations

from agent_bootstrap.agent.runtime.accounts import with_task_account

PASSWD = "root:x:0:0:root:/root:/bin/bash\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n"
GROUP = "root:x:0:\nnogroup:x:65534:\n"


def test_an_unknown_uid_and_gid_are_added_with_the_task_directory_as_home() -> None:
    passwd, group = with_task_account(PASSWD, GROUP, name="shipyard-u3", uid=20003, gid=20003, home="/w/tasks/a")
    assert passwd == PASSWD + "shipyard-u3:x:20003:20003:Shipyard task user:/w/tasks/a:/bin/sh\n"
    assert group == GROUP + "shipyard-u3:x:20003:\n"


def test_what_the_image_has_is_kept_and_names_it_uses_get_the_id() -> None:
    assert with_task_account(PASSWD, GROUP, name="nobody", uid=65534, gid=65534, home="/h") == (None, None)
    passwd, group = with_task_account(PASSWD.rstrip("\n"), GROUP, name="root", uid=1000, gid=0, home="/h")
    assert group is None  # gid 0 is the image's root group
    assert passwd is not None and passwd.splitlines()[-1] == "root-1000:x:1000:0:Shipyard task user:/h:/bin/sh"
    assert passwd.splitlines()[:2] == PASSWD.splitlines()


def test_an_image_without_the_files_gets_just_the_task_entries() -> None:
    passwd, group = with_task_account("", "", name="task", uid=7, gid=8, home="/h")
    assert (passwd, group) == ("task:x:7:8:Shipyard task user:/h:/bin/sh\n", "task:x:8:\n")


def test_files_are_written_once_by_content_in_the_agents_directory(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from agent_bootstrap.agent.runtime.accounts import write_file

    a = write_file(tmp_path / "task-etc", "passwd", "root:x:0:0::/root:/bin/sh\n")
    assert a.read_text() == "root:x:0:0::/root:/bin/sh\n" and oct(a.stat().st_mode & 0o777) == "0o644"
    assert write_file(tmp_path / "task-etc", "passwd", "root:x:0:0::/root:/bin/sh\n") == a
    b = write_file(tmp_path / "task-etc", "passwd", "other\n")
    assert b != a and b.read_text() == "other\n" and a.read_text() == "root:x:0:0::/root:/bin/sh\n"
    assert [p.name for p in a.parent.iterdir()] == ["passwd"]  # no temporary left
