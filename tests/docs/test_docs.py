"""The documentation: every runnable block of README.md and docs/ passes as written (see
runnable.py for the markers), the site builds in strict mode (a broken link or anchor fails), and
its pages render in a real browser."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import portpicker
import pytest
from runnable import RUNNABLE_LANGS, Block, blocks, pages
from server_process import REPO, answers_ping

PAGES = pages(REPO)
RUN_PAGES = [p for p in PAGES if any(b.marker in ("run", "serve") for b in blocks(p))]
PORTS = ("8080", "8500", "8501", "9000")
# What `tfservo serve` says when a port it was given is taken (HTTP's check, gRPC's bind)
_PORT_TAKEN = re.compile(r"already in use|\(port in use\?\)")
# a new user's shell: none of this machine's AWS, SageMaker, OTel or tfservo settings
_FOREIGN = re.compile(r"^(AWS_|SAGEMAKER_|TFSERVO_|OTEL_|MODEL_)")


def test_every_runnable_block_says_whether_the_suite_runs_it():
    unmarked = [b.where for p in PAGES for b in blocks(p) if b.lang in RUNNABLE_LANGS and b.marker is None]
    assert not unmarked, f"blocks without a <!-- test: run|serve|skip (why) --> marker: {unmarked}"
    unexplained = [b.where for p in PAGES for b in blocks(p) if b.marker == "skip" and not b.reason]
    assert not unexplained, f"skipped blocks must say why: {unexplained}"
    assert RUN_PAGES, "no page has runnable blocks"


@pytest.fixture(scope="session")
def example_models(tmp_path_factory) -> Path:
    """examples/models built once from code; each page gets its own copy."""
    out = tmp_path_factory.mktemp("docs-models")
    subprocess.run([sys.executable, str(REPO / "examples" / "build_models.py"), str(out)], check=True, timeout=600)
    return out


def _sandbox(root: Path, models: Path) -> Path:
    """A fresh folder laid out like a clone: .venv and examples/ (with its own examples/models)."""
    (root / ".venv").symlink_to(REPO / ".venv")
    (root / "examples").mkdir()
    for item in (REPO / "examples").iterdir():
        if item.name != "models":
            (root / "examples" / item.name).symlink_to(item)
    shutil.copytree(models, root / "examples" / "models")
    return root


def _pinned(text: str) -> str:
    """A serve block with tfservo's default ports written out (`--port 8080 --grpc-port 9000`), so
    the stand-ins replace them too."""
    lines, in_serve = text.splitlines(), False
    for i, line in enumerate(lines):
        in_serve = in_serve or "tfservo serve" in line
        command, hash_, comment = line.partition(" #")
        if in_serve and not command.rstrip().endswith("\\"):
            whole = "\n".join(lines[: i + 1])
            extra = "".join(f" {flag} {port}" for flag, port in (("--port", "8080"), ("--grpc-port", "9000"))
                            if flag not in whole)
            lines[i] = command.rstrip() + extra + (f" {hash_}{comment}" if hash_ else "")
            in_serve = False
    return "\n".join(lines)


def _squeeze(text: str) -> str:
    return re.sub(r"\s+", "", text)


def _run(args: list[str], cwd: Path, env: dict[str, str], stem: Path) -> tuple[int, str, str]:
    """Run a block to its end; what it left running in the background is stopped after it (its
    output goes to files, so a leftover child cannot hold a pipe open)."""
    out, err = stem.with_suffix(".out"), stem.with_suffix(".err")
    with open(out, "w") as stdout, open(err, "w") as stderr:
        proc = subprocess.Popen(args, cwd=cwd, env=env, stdout=stdout, stderr=stderr, start_new_session=True)
        try:
            code = proc.wait(600)
        finally:
            _stop(proc)
    return code, out.read_text(), err.read_text()


def _stop(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(30)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


@pytest.mark.parametrize("page", RUN_PAGES, ids=[str(p.relative_to(REPO)) for p in RUN_PAGES])
def test_the_pages_commands_work_as_written(page, example_models, tmp_path):
    cwd = _sandbox(tmp_path, example_models)
    ports = {port: str(portpicker.pick_unused_port()) for port in PORTS}
    env = {k: v for k, v in os.environ.items() if not _FOREIGN.match(k)}
    servers: list[tuple[Block, subprocess.Popen, Path]] = []
    last: tuple[Block, str] | None = None

    def text_of(block: Block, text: str | None = None) -> str:
        return re.sub(r"\b(8080|8500|8501|9000)\b", lambda m: ports[m.group(1)], block.text if text is None else text)

    try:
        for block in blocks(page):
            if block.marker == "serve":
                for _, running, _ in servers:  # one server at a time: the next one takes the same port
                    _stop(running)
                log = tmp_path / f"serve-{block.line}.log"
                for attempt in range(3):
                    with open(log, "w") as out:
                        proc = subprocess.Popen(["bash", "-c", text_of(block, _pinned(block.text))], cwd=cwd, env=env,
                                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
                    servers.append((block, proc, log))
                    port = next((ports[p] for p in PORTS if re.search(rf"\b{p}\b", block.text)), ports["8080"])
                    if answers_ping(f"http://127.0.0.1:{port}", proc, 180):
                        break
                    said = log.read_text()
                    if attempt < 2 and _PORT_TAKEN.search(said):
                        # The picked ports are ephemeral ones, free when picked: another process's
                        # outgoing connection can take one before the server binds it. Pick it again.
                        _stop(proc)
                        taken = [p for p, number in ports.items() if re.search(rf"\b{number}\b", said)] or list(PORTS)
                        ports.update({p: str(portpicker.pick_unused_port()) for p in taken})
                        continue
                    pytest.fail(f"{block.where}: the server did not answer /ping:\n{said[-3000:]}")
            elif block.marker == "run":
                if block.lang == "python":
                    script = tmp_path / f"block-{block.line}.py"
                    script.write_text(text_of(block))
                    args = [str(cwd / ".venv" / "bin" / "python"), str(script)]
                else:
                    args = ["bash", "-eo", "pipefail", "-c", text_of(block)]
                code, stdout, stderr = _run(args, cwd, env, tmp_path / f"block-{block.line}")
                assert code == 0, (f"{block.where} exited {code}:\n{block.text}\nstdout:\n{stdout[-3000:]}\n"
                                   f"stderr:\n{stderr[-3000:]}")
                last = (block, stdout)
            elif block.marker == "output":
                assert last is not None, f"{block.where}: an output block with no run block before it"
                ran, stdout = last
                for line in text_of(block).splitlines():
                    if line.strip():
                        assert _squeeze(line) in _squeeze(stdout), (
                            f"{block.where}: {ran.where}'s output lacks {line.strip()!r}:\n{stdout[-3000:]}")
    finally:
        for _, proc, _ in servers:
            _stop(proc)


# -- the site ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("site")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1", "DISABLE_MKDOCS_2_WARNING": "true"}
    done = subprocess.run([str(Path(sys.executable).parent / "mkdocs"), "build", "--strict", "-d", str(out)],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]
    return out


def test_the_site_builds_strictly_with_generated_reference_pages(site):
    settings = (site / "reference" / "settings" / "index.html").read_text()
    from tfservo.core.settings import options

    for option in options():  # every declared setting, each flag and variable
        assert f"<code>{option.name}</code>" in settings
        for name in (*option.flags, *option.env):
            assert f"<code>{name}</code>" in settings
    cli = (site / "reference" / "cli" / "index.html").read_text()
    for command in ("serve", "transform", "invoke", "inspect", "evaluate", "--follow"):
        assert command in cli
    api = (site / "reference" / "http-api" / "index.html").read_text()
    for path in ("/invocations", "/v1/models/MODEL:predict", "/v2/models/MODEL/infer", "/ping"):
        assert f"<code>{path}</code>" in api


def test_the_committed_reference_pages_are_as_generated():
    """docs/reference/ is read as committed Markdown: a changed setting, command or route needs
    `scripts/docs_reference.py` run again."""
    done = subprocess.run([sys.executable, str(REPO / "scripts" / "docs_reference.py"), "--check"],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    cli = (REPO / "docs" / "reference" / "cli.md").read_text()
    assert "### `tfservo serve`" in cli and "\nSecurity:\n" in cli and "--api-keys" in cli


@pytest.fixture(scope="module")
def site_server(site):
    port = portpicker.pick_unused_port()
    proc = subprocess.Popen([sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1", "-d", str(site)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    for _ in range(100):
        try:
            httpx.get(base, timeout=1)
            break
        except httpx.TransportError:
            time.sleep(0.1)
    yield base
    _stop(proc)


def test_a_page_renders_with_navigation_and_search_in_a_browser(site_server):
    from browser import chromium
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ready
    from selenium.webdriver.support.ui import WebDriverWait

    with chromium() as page:
        page.get(f"{site_server}/getting-started/")
        wait = WebDriverWait(page, 30)
        wait.until(ready.title_contains("Getting started"))
        nav = page.find_element(By.CSS_SELECTOR, "nav.md-nav--primary").get_attribute("textContent")
        for title in ("Serving", "Clients", "Batch transform", "Settings", "From TF Serving"):
            assert title in nav
        # the site's own search, built at build time and run in the page (no server side)
        box = wait.until(ready.element_to_be_clickable((By.CSS_SELECTOR, "input.md-search__input")))
        box.click()
        box.send_keys("poll seconds")
        wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, ".md-search-result__item"))
        errors = [e for e in page.get_log("browser") if e["level"] == "SEVERE"]
        assert not errors, errors
