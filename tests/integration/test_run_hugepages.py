"""The rendered huge-page host script, run for real against a fake /proc/meminfo and a fake
/proc/sys/vm/nr_hugepages (scripts.hugepages takes their paths; nothing else differs from what runs
on the node). The committed stacks want 500 GiB of huge pages."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from ascend_pd import scripts, shell
from ascend_pd.loader import load_stack
from ascend_pd.plan import build_plan

pytestmark = pytest.mark.integration

GIB = 500  # both committed stacks


def meminfo(page_kib: int | None, total: int, available_kib: int = 123456789) -> str:
    lines = [
        "MemTotal:       1585446208 kB",
        "MemFree:        1485446208 kB",
        f"MemAvailable:   {available_kib} kB",
        "AnonHugePages:         0 kB",
        f"HugePages_Total:   {total}",
        f"HugePages_Free:    {total}",
        "HugePages_Rsvd:        0",
        "HugePages_Surp:        0",
    ]
    if page_kib is not None:
        lines.append(f"Hugepagesize:       {page_kib} kB")
    lines.append(f"Hugetlb:        {total * (page_kib or 0)} kB")
    return "\n".join(lines) + "\n"


class Host:
    """Fake kernel files plus the script rendered against them."""

    def __init__(self, tmp: Path, stack: str, *, page_kib: int | None, granted: int, before: str = "0"):
        self.dir = tmp
        self.meminfo = tmp / "proc" / "meminfo"
        self.nr = tmp / "proc" / "sys" / "vm" / "nr_hugepages"
        self.sysctl = tmp / "etc" / "sysctl.d" / "90-ascend-pd-hugepages.conf"
        self.state = tmp / "var" / "lib" / "ascend-pd" / "nr_hugepages.before"
        self.nr.parent.mkdir(parents=True)
        self.meminfo.write_text(meminfo(page_kib, granted))
        self.nr.write_text(before + "\n")
        plan = build_plan(load_stack(stack), stack)
        assert plan.cfg.hugepages.gib == GIB
        self.script = scripts.hugepages(plan, plan.nodes[0].name, meminfo=str(self.meminfo),
                                        nr_hugepages=str(self.nr), sysctl_file=str(self.sysctl),
                                        state_file=str(self.state))

    def run(self, kind: str, *, wrapped: bool = False) -> subprocess.CompletedProcess:
        text = getattr(self.script, kind)
        if wrapped:  # exactly the command Pulumi sends over SSH, through a POSIX sh
            return subprocess.run(["sh", "-c", shell.on_host(text)], capture_output=True, text=True, timeout=30)
        return subprocess.run(["bash", "-s"], input=text, capture_output=True, text=True, timeout=30)

    @property
    def nr_value(self) -> str:
        return self.nr.read_text().strip()


@pytest.mark.parametrize("stack", ["a2-8node", "a3-4node"])
@pytest.mark.parametrize("page_kib, pages", [(2048, 256000), (524288, 1000)])
def test_reserves_the_exact_page_count_and_delete_restores(tmp_path: Path, stack: str, page_kib: int, pages: int):
    assert GIB * 1024 * 1024 // page_kib == pages
    h = Host(tmp_path, stack, page_kib=page_kib, granted=pages, before="64")
    r = h.run("create")
    assert r.returncode == 0, r.stderr
    assert h.nr_value == str(pages)
    assert h.sysctl.read_text() == f"vm.nr_hugepages = {pages}\n"  # survives a reboot
    assert h.state.read_text().strip() == "64"
    assert f"{pages} x {page_kib} kB" in r.stdout

    # Idempotent: the second run keeps the value from before the FIRST run.
    again = h.run("create")
    assert again.returncode == 0, again.stderr
    assert h.nr_value == str(pages) and h.state.read_text().strip() == "64"

    gone = h.run("delete")
    assert gone.returncode == 0, gone.stderr
    assert h.nr_value == "64"
    assert "restored to 64" in gone.stdout
    assert not h.state.exists() and not h.sysctl.exists()
    # Delete twice: nothing recorded, nothing to restore, still succeeds.
    twice = h.run("delete")
    assert twice.returncode == 0 and h.nr_value == "64"


@pytest.mark.parametrize("page_kib, pages", [(2048, 256000), (524288, 1000)])
def test_kernel_granting_fewer_pages_fails_and_restores(tmp_path: Path, page_kib: int, pages: int):
    h = Host(tmp_path, "a2-8node", page_kib=page_kib, granted=pages // 2, before="17")
    r = h.run("create")
    assert r.returncode != 0
    assert f"gave {pages // 2} of {pages} huge pages of {page_kib} kB" in r.stderr
    assert "MemAvailable: 123456789 kB" in r.stderr
    assert "ascend-pd:hugepages.gib" in r.stderr  # the setting to change
    assert h.nr_value == "17"  # nothing stays half-configured
    assert not h.state.exists() and not h.sysctl.exists()


def test_kernel_without_huge_pages_fails_clearly(tmp_path: Path):
    h = Host(tmp_path, "a3-4node", page_kib=None, granted=0, before="0")
    r = h.run("create")
    assert r.returncode != 0
    assert "has no Hugepagesize" in r.stderr
    assert h.nr_value == "0" and not h.state.exists()


def test_scripts_work_through_the_ssh_wrapper(tmp_path: Path):
    """on_host(): the heredoc Pulumi sends over SSH carries the script intact, even through dash."""
    h = Host(tmp_path, "a3-4node", page_kib=2048, granted=256000, before="5")
    r = h.run("create", wrapped=True)
    assert r.returncode == 0, r.stderr
    assert h.nr_value == "256000"
    r = h.run("delete", wrapped=True)
    assert r.returncode == 0, r.stderr
    assert h.nr_value == "5"


def test_failed_rerun_keeps_what_the_last_good_run_set(tmp_path: Path):
    """A create that fails after an earlier success rolls back to that success's count (the
    workers still use it), and keeps the pre-ascend-pd count for delete."""
    h = Host(tmp_path, "a3-4node", page_kib=2048, granted=256000, before="9")
    assert h.run("create").returncode == 0 and h.nr_value == "256000"
    h.meminfo.write_text(meminfo(2048, 1000))  # the kernel now has fewer (e.g. after a reboot)
    r = h.run("create")
    assert r.returncode != 0 and "gave 1000 of 256000" in r.stderr
    assert h.nr_value == "256000"
    assert h.state.read_text().strip() == "9"
    assert h.run("delete").returncode == 0 and h.nr_value == "9"
