"""``messaging token create|list|revoke`` (messaging.cli.tokens), run through ``main`` on real
files."""

from __future__ import annotations

import argparse
import fcntl
import os
import stat
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from messaging.cli import tokens as token_commands
from messaging.cli.main import main
from messaging.errors import UnauthorizedError
from messaging.http.auth import Tokens, hash_token, new_token, parse_scope, token_line


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """``messaging ARGS`` in this process: exit status, stdout, stderr."""
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def test_create_without_a_file_prints_the_token_and_its_line(
        capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _err = run(capsys, "token", "create", "--name", "reporter",
                          "--scope", "read=1,chat/*", "--scope", "consume=reporter-*")
    assert code == 0
    token = out.split("token: ", 1)[1].split()[0]
    line = out.strip().splitlines()[-1]
    assert line == f"reporter {hash_token(token)} read=1,chat/* consume=reporter-*"


def test_create_adds_to_the_file_created_0600_and_prints_only_the_token(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "tokens"
    code, out, err = run(capsys, "token", "create", "--name", "admin", "--scope", "admin",
                         "--tokens", str(path))
    assert code == 0
    admin = out.strip()
    assert out == admin + "\n" and admin.startswith("msg_")
    assert f"added token 'admin' (admin) to {path}" in err and admin not in err
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert path.read_text() == f"admin {hash_token(admin)} admin\n"

    # A second token is appended; the file keeps the permissions it was given.
    path.chmod(0o640)
    path.write_text(path.read_text().rstrip("\n") + "  # no newline at the end")
    code, out, _err = run(capsys, "token", "create", "--name", "reporter",
                          "--scope", "read=1", "--tokens", str(path))
    assert code == 0
    reporter = out.strip()
    assert stat.S_IMODE(path.stat().st_mode) == 0o640
    tokens = Tokens(path)
    assert tokens.principal(f"Bearer {admin}").name == "admin"
    assert tokens.principal(f"Bearer {reporter}").name == "reporter"
    assert list(tmp_path.iterdir()) == [path]  # no temporary file left behind


def test_create_writes_the_token_to_a_new_0600_token_file(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path, saved = tmp_path / "tokens", tmp_path / "admin.token"
    code, out, err = run(capsys, "token", "create", "--name", "admin", "--scope", "admin",
                         "--tokens", str(path), "--token-file", str(saved))
    assert code == 0 and out == "" and f"wrote the token to {saved} (0600)" in err
    assert stat.S_IMODE(saved.stat().st_mode) == 0o600
    admin = saved.read_text().strip()
    assert admin not in err and Tokens(path).principal(f"Bearer {admin}").name == "admin"

    # Never over a file that exists, nor when the name is taken: both files stay as they were.
    for name, message in [("other", f"--token-file {saved} already exists"),
                          ("admin", f"{path} already has a token named 'admin'")]:
        target = saved if name == "other" else tmp_path / "second.token"
        code, out, err = run(capsys, "token", "create", "--name", name, "--scope", "read",
                             "--tokens", str(path), "--token-file", str(target))
        assert code == 1 and out == "" and err.count("\n") == 1 and message in err, err
    assert saved.read_text() == admin + "\n" and not (tmp_path / "second.token").exists()
    assert len(Tokens(path)) == 1


def test_create_refuses_a_name_already_in_the_file_and_bad_input(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "tokens"
    path.write_text(token_line("ops", new_token(), [parse_scope("admin")]) + "\n")
    before = path.read_text()
    for args, message in [
        (("--name", "ops", "--scope", "read"), f"{path} already has a token named 'ops'"),
        (("--name", "two words", "--scope", "read"), "invalid --name 'two words'"),
        (("--name", "a#b", "--scope", "read"), "invalid --name 'a#b'"),
        (("--name", "x", "--scope", "root"), "unknown scope 'root'"),
    ]:
        code, out, err = run(capsys, "token", "create", *args, "--tokens", str(path))
        assert code == 1 and out == "" and err.count("\n") == 1, err
        assert err.startswith("messaging token: error: ") and message in err
    assert path.read_text() == before


def test_list_shows_names_and_scopes_never_hashes(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "tokens"
    secret = new_token()
    path.write_text("# the broker's tokens\n"
                    + token_line("ops", secret, [parse_scope("admin")]) + "\n\n"
                    + token_line("reporter", new_token(), [parse_scope("read=1,chat/*"),
                                                           parse_scope("consume=r-*")]) + "\n")
    code, out, _err = run(capsys, "token", "list", "--tokens", str(path))
    assert code == 0
    assert out.splitlines() == ["NAME      SCOPES", "ops       admin",
                                "reporter  read=1,chat/* consume=r-*"]
    assert "sha256" not in out and secret not in out


def test_list_and_revoke_of_a_missing_or_broken_file_are_one_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "absent"
    for args in (("list",), ("revoke", "ops")):
        code, out, err = run(capsys, "token", *args, "--tokens", str(missing))
        assert code == 1 and out == "" and err.count("\n") == 1
        assert f"cannot read tokens file {missing}: No such file or directory" in err
    broken = tmp_path / "tokens"
    broken.write_text("ops sha256:00 admin\nreporter md5:00 read\n")
    for args in (("list",), ("revoke", "ops")):
        code, out, err = run(capsys, "token", *args, "--tokens", str(broken))
        assert code == 1 and out == "" and err.count("\n") == 1
        assert f"{broken}:2: expected NAME sha256:HEX SCOPE..." in err
    assert broken.read_text() == "ops sha256:00 admin\nreporter md5:00 read\n"


def test_revoke_removes_only_that_token(tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "tokens"
    ops, reporter = new_token(), new_token()
    text = ("# ops first\n" + token_line("ops", ops, [parse_scope("admin")]) + "\n"
            + token_line("reporter", reporter, [parse_scope("read")]) + "  # until May\n")
    path.write_text(text)
    path.chmod(0o640)
    code, out, _err = run(capsys, "token", "revoke", "reporter", "--tokens", str(path))
    assert code == 0 and f"revoked token 'reporter' in {path}" in out
    assert path.read_text() == text.splitlines(keepends=True)[0] + text.splitlines(True)[1]
    assert stat.S_IMODE(path.stat().st_mode) == 0o640
    tokens = Tokens(path)
    assert tokens.principal(f"Bearer {ops}").name == "ops"
    with pytest.raises(UnauthorizedError):
        tokens.principal(f"Bearer {reporter}")
    code, out, err = run(capsys, "token", "revoke", "reporter", "--tokens", str(path))
    assert code == 1 and out == "" and err.count("\n") == 1
    assert f"no token named 'reporter' in {path} (tokens: ops)" in err
    assert list(tmp_path.iterdir()) == [path]


def test_a_change_waits_for_another_one_then_gives_up(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Two commands at once never lose each other's change: the second waits for the lock on
    the directory (here held by the test), and gives up with one line after LOCK_TIMEOUT."""
    monkeypatch.setattr(token_commands, "LOCK_TIMEOUT", 0.05)
    path = tmp_path / "tokens"
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        code, out, err = run(capsys, "token", "create", "--name", "ops", "--scope", "admin",
                             "--tokens", str(path))
    finally:
        os.close(fd)
    assert code == 1 and out == "" and err.count("\n") == 1
    assert f"another command has been changing {path}" in err
    assert not path.exists()


names = st.lists(st.text("abcxyz-", min_size=1, max_size=6).map("t".__add__), min_size=1,
                 max_size=5, unique=True)


@given(names=names, data=st.data())
def test_revoke_keeps_every_other_line(tmp_path_factory: pytest.TempPathFactory,
                                       names: list[str], data: st.DataObject) -> None:
    """Whatever the file holds (tokens, comments, blank lines), revoking one token removes
    its line and nothing else."""
    lines: list[str] = []
    for name in names:
        if data.draw(st.booleans(), label="comment before"):
            lines.append(data.draw(st.sampled_from(["# note", "", "   "]), label="comment"))
        lines.append(token_line(name, f"msg_{name}", [parse_scope("read=1")]))
    victim = data.draw(st.sampled_from(names), label="revoked")
    path = tmp_path_factory.getbasetemp() / "revoke-tokens"
    path.write_text("\n".join(lines) + "\n")
    assert token_commands.revoke_token(argparse.Namespace(name=victim, tokens=path)) == 0
    expected = [line for line in lines if not line.startswith(victim + " ")]
    assert path.read_text() == "\n".join(expected) + ("\n" if expected else "")
