"""Secrets and HTTP rules without a sandbox: what an entry means, what is refused at
plan time (typed errors), what the plan shows, and the substitutions themselves
(placeholder -> value in requests, value -> placeholder in answers cut anywhere)."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest

from conftest import run_cli
from warren.errors import ConfigError, PolicyError
from warren.net import secrets as s
from warren.plan import CallerFacts, make_plan
from warren.plan.render import render
from warren.policy import PolicySpec, build, config
from warren.server.hostfacts import gather


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    d = tmp_path / "ws"
    d.mkdir()
    return d


def test_secret_entries_parse_with_their_source_and_hosts() -> None:
    r = s.parse_secret("TOKEN=GH_TOKEN@api.github.com, GitHub.com.")
    assert (r.name, r.env, r.file, r.hosts) == ("TOKEN", "GH_TOKEN", None, ("api.github.com", "github.com"))
    f = s.parse_secret("PW=file:~/.config/pw@pypi.example.org")
    assert (f.file, f.source) == ("~/.config/pw", "file ~/.config/pw")
    for bad in (
        "TOKEN",
        "TOKEN=GH_TOKEN",
        "1X=A@h.org",
        "T=A@",
        "T=bad-var@h.org",
        "T=A@10.0.0.1/8",
        "T=file:@h",
    ):
        with pytest.raises(PolicyError) as e:
            s.parse_secret(bad)
        assert "NAME=ENVVAR@HOST" in (e.value.hint or "")
    with pytest.raises(PolicyError, match="given twice"):
        s.parse_secrets(["T=A@h.org", "T=B@h.org"])


def test_http_rules_match_method_and_path_prefix() -> None:
    rule = s.parse_http_rule("POST api.example.org/v1/")
    assert rule.allows("POST", "/v1/chat?x=1") and not rule.allows("GET", "/v1/chat")
    assert not rule.allows("POST", "/v2/") and not rule.allows("POST", "/v1")
    anyway = s.parse_http_rule("* api.example.org")
    assert anyway.allows("DELETE", "/anything") and anyway.prefix == "/"
    assert s.parse_http_rule("GET h.org/%7Euser/").prefix == "/~user/"
    assert rule.allows("POST", "/v1/%63hat") and rule.allows("POST", "/%76%31/chat")
    for path in ("/v1/../admin", "/v1/%2e%2E/admin", "/v1/..;/admin", "/v1/.%2e", "/v1/a%2Fb", "/v1/a%5cb"):
        assert s.ambiguous_path(path) is not None, path
        assert rule.allows("POST", path)  # control: the prefix alone lets it through (checked first)
    for path in ("/v1/a.b/..c/...", "/v1/x?next=/../", "/v1/%7e"):
        assert s.ambiguous_path(path) is None, path
    for bad in ("post api.example.org/", "GET", "GET not_a host/", "GET h.org/a/../b", "GET h.org/a%2fb"):
        with pytest.raises(PolicyError):
            s.parse_http_rule(bad)


def test_basic_bearer_and_custom_headers_get_the_value_and_answers_lose_it() -> None:
    ph = s.placeholder("TOKEN", "nonce")
    assert ph.startswith("warren-secret-TOKEN-") and len(ph) >= 52 and ph != s.placeholder("TOKEN", "other")
    sub = s.Substituter({ph.encode(): b"real-value-123"})
    assert sub.request_value(f"Bearer {ph}") == ("Bearer real-value-123", ["TOKEN"])
    basic = "Basic " + base64.b64encode(f"user:{ph}".encode()).decode()
    out, used = sub.request_value(basic)
    assert base64.b64decode(out.split()[1]) == b"user:real-value-123" and used == ["TOKEN"]
    assert sub.request_value("no placeholder here") == ("no placeholder here", [])
    assert sub.scrub(b"x real-value-123 y") == f"x {ph} y".encode()


def test_the_stream_scrubber_catches_a_value_split_across_pieces() -> None:
    ph = s.placeholder("K", "n").encode()
    value = b"sk-0123456789abcdef"
    body = b"a" * 10 + value + b"b" * 5 + value
    for cut in range(1, len(body)):
        scrubber = s.StreamScrubber(s.Substituter({ph: value}))
        out = scrubber.feed(body[:cut]) + scrubber.feed(body[cut:]) + scrubber.flush()
        assert out == b"a" * 10 + ph + b"b" * 5 + ph, cut
    # control: without scrubbing, the value is there to find
    assert value in body
    # what cannot begin the value is passed on at once (an event stream that pauses)
    scrubber = s.StreamScrubber(s.Substituter({ph: value}))
    assert scrubber.feed(b"event: done\n\n") == b"event: done\n\n"
    assert scrubber.feed(b"data: sk-01") == b"data: " and scrubber.flush() == b"sk-01"


def _decodings(text: bytes) -> list[bytes]:
    """``text`` decoded as base64 from each of its first four characters."""
    out = []
    for start in range(4):
        piece = text[start:].rstrip(b"=")
        piece = piece[: len(piece) - 1] if len(piece) % 4 == 1 else piece
        out.append(base64.b64decode(piece + b"=" * (-len(piece) % 4)))
    return out


def test_every_form_the_proxy_made_of_a_value_is_scrubbed_at_every_alignment() -> None:
    """The value inside base64 text at each of its three alignments, percent-encoded,
    and the Basic credential the proxy built: none decodes to the value after the
    scrub, cut anywhere in a stream. The built credential comes back as the sandbox's."""
    import urllib.parse

    ph = s.placeholder("TOKEN", "n")
    value = b"ghp_REAL+/token_0123456789"
    sub = s.Substituter({ph.encode(): value})
    sent_cred = "Basic " + base64.b64encode(f"user:{ph}".encode()).decode()
    built, _ = sub.request_value(sent_cred)
    echoes = [built.encode()] + [base64.b64encode(b"x" * i + b"user:" + value + b"!") for i in range(3)]
    echoes.append(urllib.parse.quote_from_bytes(value, safe="").encode())
    # control: as the server sent them, the value is there to find
    assert all(any(value in d for d in _decodings(text.split()[-1])) for text in echoes[:4])
    assert urllib.parse.unquote_to_bytes(echoes[4]) == value and echoes[4] != value
    body = b"<" + b"|".join(echoes) + b">"
    whole = sub.scrub(body)

    def leaks(out: bytes) -> bool:
        parts = out[1:-1].split(b"|")
        return value in out or any(value[2:-2] in d for p in parts[:4] for d in _decodings(p.split()[-1]))

    assert leaks(body) and not leaks(whole)  # control, and the scrub
    for cut in range(1, len(body)):
        scrubber = s.StreamScrubber(sub)
        out = scrubber.feed(body[:cut]) + scrubber.feed(body[cut:]) + scrubber.flush()
        assert not leaks(out), cut
        # the credential cut by a read comes back with its inner fragment replaced
        # instead of whole; anywhere else, as scrubbed whole
        assert out == whole or 7 < cut < 7 + len(echoes[0]) - 6, cut
    parts = whole[1:-1].split(b"|")
    assert parts[0] == sent_cred.encode()  # what the sandbox sent, as it sent it
    for part in parts[1:4]:
        decoded = _decodings(part)
        assert not any(value[2:-2] in d for d in decoded), part
        assert any(ph.encode()[2:-2] in d for d in decoded), part  # the sandbox's text, re-encoded
    assert parts[4] == ph.encode()
    assert value not in out
    # what a connection remembers of the credentials it built is bounded
    for i in range(100):
        sub.request_value("Basic " + base64.b64encode(f"user{i}:{ph}".encode()).decode())
    assert len(sub.produced) == s.MAX_PRODUCED and len(sub.reverse) <= s.MAX_PRODUCED + 5
    old = base64.b64encode(b"user0:" + value)
    assert not any(value[2:-2] in d for d in _decodings(sub.scrub(old)))  # still no value


def test_the_scan_for_values_never_looks_past_the_pieces_end() -> None:
    value = b"sk-0123456789abcdef"
    sub = s.Substituter({s.placeholder("K", "n").encode(): value})
    # a proxy buffer holds stale bytes after the piece's end: a value they complete is not there
    buf = bytearray(b"x" * 10 + value)
    assert sub.occurs_in(buf, 10, len(buf)) and sub.occurs_in(bytes(buf), 0, len(buf))
    assert not sub.occurs_in(buf, 0, len(buf) - 1) and not sub.occurs_in(buf, 11, len(buf))


def _spec(ws: Path, **kw: object) -> PolicySpec:
    return PolicySpec(workspace=str(ws), **kw)  # type: ignore[arg-type]


def test_a_secret_for_a_host_that_is_not_allowed_is_a_typed_error_naming_both(ws: Path) -> None:
    with pytest.raises(PolicyError) as e:
        build(_spec(ws, allow_hosts=["pypi.org"], secrets=["TOKEN=GH@api.github.com"]))
    assert "secret TOKEN" in e.value.message and "api.github.com" in e.value.message
    assert "--allow-host api.github.com" in (e.value.hint or "")
    with pytest.raises(PolicyError, match="HTTP rule"):
        build(_spec(ws, allow_hosts=["pypi.org"], allow_http=["GET example.org/"]))
    with pytest.raises(PolicyError, match="needs --network allow"):
        build(_spec(ws, network="open", secrets=["TOKEN=GH@api.github.com"]))
    ok = build(_spec(ws, allow_hosts=["*.github.com"], secrets=["TOKEN=GH@api.github.com"]))
    assert ok.secret_rules[0].hosts == ("api.github.com",)


def test_a_workspace_file_cannot_add_a_secret_or_an_http_rule(ws: Path, tmp_path: Path) -> None:
    for line in ('secrets = ["T=HOME@evil.example"]', 'allow_http = ["GET evil.example/"]'):
        (ws / "warren.toml").write_text(line + "\n")
        with pytest.raises(ConfigError) as e:
            config.load_spec(ws, None, env={}, home=tmp_path, user_config=tmp_path / "none.toml")
        assert str(ws / "warren.toml") in e.value.message and line.split(" ")[0] in e.value.message
        assert "--secret" in (e.value.hint or "") or "--allow-http" in (e.value.hint or "")


def test_the_plan_lists_secrets_by_name_and_host_never_their_value(ws: Path, tmp_path: Path) -> None:
    env = {"HOME": str(tmp_path), "PATH": "/usr/bin:/bin", "GH": "ghp_real_value_1234"}
    policy = build(
        _spec(
            ws,
            allow_hosts=["api.github.com"],
            secrets=["TOKEN=GH@api.github.com"],
            allow_http=["GET api.github.com/repos/"],
        ),
        env=env,
        home=tmp_path,
    )
    caller = CallerFacts(uid=1000, gid=1000, home=str(tmp_path), env=env, cwd=str(ws))
    plan = make_plan(
        policy,
        gather(state_dir=str(tmp_path / "state")),
        caller,
        secret_nonce="abc",
        trust_bundle=str(tmp_path / "state/tls/b.pem"),
    )
    text = render(plan)
    assert "secret TOKEN (from $GH): put in by the proxy for api.github.com only" in text
    assert "http rule: GET api.github.com/repos/" in text and "TLS intercepted for api.github.com" in text
    assert plan.env["TOKEN"] == s.placeholder("TOKEN", "abc")
    assert (
        plan.env["SSL_CERT_FILE"] == plan.env["NODE_EXTRA_CA_CERTS"] == "/etc/ssl/certs/ca-certificates.crt"
    )
    assert any(op.target == "/etc/ssl/certs/ca-certificates.crt" for op in plan.mounts)
    assert "ghp_real_value_1234" not in text and "ghp_real_value_1234" not in repr(plan.to_dict())
    # control: the value would be seen if it were passed
    passed = build(_spec(ws, env_pass=["GH"]), env=env, home=tmp_path)
    assert "ghp_real_value_1234" in repr(make_plan(passed, gather(), caller).env)


def test_agent_presets_pass_their_api_key_as_a_secret(ws: Path, tmp_path: Path) -> None:
    env = {"HOME": str(tmp_path), "ANTHROPIC_API_KEY": "sk-ant-real"}
    policy = build(_spec(ws, network="allow", presets=["claude-code"]), env=env, home=tmp_path)
    assert policy.secrets == ("ANTHROPIC_API_KEY=ANTHROPIC_API_KEY@api.anthropic.com",)
    # no key in the caller's environment: nothing to put in
    assert (
        build(
            _spec(ws, network="allow", presets=["claude-code"]), env={"HOME": str(tmp_path)}, home=tmp_path
        ).secrets
        == ()
    )
    # the caller's own choice wins: passing the real value explicitly
    chosen = build(
        _spec(ws, network="allow", presets=["claude-code"], env_pass=["ANTHROPIC_API_KEY"]),
        env=env,
        home=tmp_path,
    )
    assert chosen.secrets == ()


def test_the_cli_plans_secrets_and_refuses_a_bad_one_with_a_hint(ws: Path, state_home: Path) -> None:
    env = {"WT_TOKEN": "real-value-not-shown"}
    flags = ["--allow-host", "api.example.org", "--secret", "TOKEN=WT_TOKEN@api.example.org"]
    flags += ["--allow-http", "GET api.example.org/v1/"]
    r = run_cli(["plan", *flags], cwd=ws, env=env)
    assert r.returncode == 0, r.stderr
    assert "secret TOKEN (from $WT_TOKEN): put in by the proxy for api.example.org only" in r.stdout
    assert "http rule: GET api.example.org/v1/" in r.stdout and "real-value-not-shown" not in r.stdout
    bad = run_cli(["run", "--secret", "TOKEN=WT_TOKEN", "--", "true"], cwd=ws, env=env)
    assert bad.returncode == 125 and "NAME=ENVVAR@HOST" in bad.stderr and "Traceback" not in bad.stderr
    missing = run_cli(
        ["run", *flags, "--secret", "X=WT_ABSENT@api.example.org", "--", "true"], cwd=ws, env=env
    )
    assert missing.returncode == 125 and "$WT_ABSENT is not set" in missing.stderr
    assert "Traceback" not in missing.stderr
