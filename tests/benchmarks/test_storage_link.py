"""The benchmark's per-process storage link: which disk is capped, and how (cgroup v1 or v2)."""

import os

import pytest

from benchmarks import storage_link as sl


def _fake_sys(tmp_path, target: str, partition: bool) -> str:
    """A /sys whose dev/block entry for `target`'s device is a partition of disk 254:0 (or
    the disk itself)."""
    st = os.stat(target)
    dev = f"{os.major(st.st_dev)}:{os.minor(st.st_dev)}"
    disk = tmp_path / "sys" / "devices" / "vda"
    part = disk / "vda1"
    part.mkdir(parents=True)
    (disk / "dev").write_text("254:0\n")
    (part / "dev").write_text(dev + "\n")
    if partition:
        (part / "partition").write_text("1\n")
    (tmp_path / "sys" / "dev" / "block").mkdir(parents=True)
    os.symlink(part, tmp_path / "sys" / "dev" / "block" / dev)
    return str(tmp_path / "sys")


@pytest.mark.parametrize("partition", [True, False])
def test_the_cap_goes_on_the_whole_disk_under_the_path(tmp_path, partition):
    """Block-I/O throttles apply to disks: a path on a partition is capped on its disk."""
    target = tmp_path / "ckpt"
    target.mkdir()
    sys_root = _fake_sys(tmp_path, str(target), partition)
    st = os.stat(target)
    own = f"{os.major(st.st_dev)}:{os.minor(st.st_dev)}"
    assert sl.disk_of(str(target), sys_root) == ("254:0" if partition else own)


def test_a_path_on_no_block_device_is_refused_not_run_uncapped(tmp_path):
    with pytest.raises(sl.LinkUnavailable, match="not on a block device"):
        sl.disk_of(str(tmp_path), str(tmp_path / "empty-sys"))


def test_each_cgroup_version_gets_its_own_line(tmp_path):
    assert sl.limit_line("io.max", "254:0", 1 << 28) == "254:0 rbps=268435456\n"
    assert sl.limit_line("blkio.throttle.read_bps_device", "8:0", 5) == "8:0 5\n"
    v1 = tmp_path / "v1"
    (v1 / "blkio").mkdir(parents=True)
    (v1 / "blkio" / "blkio.throttle.read_bps_device").write_text("")
    assert sl._layout(str(v1)) == (str(v1 / "blkio"), "blkio.throttle.read_bps_device")
    v2 = tmp_path / "v2"
    v2.mkdir()
    (v2 / "cgroup.subtree_control").write_text("cpu io memory\n")
    assert sl._layout(str(v2)) == (str(v2), "io.max")
    (v2 / "cgroup.subtree_control").write_text("cpu memory\n")
    assert sl._layout(str(v2)) is None
    with (
        pytest.raises(sl.LinkUnavailable, match="no cgroup block-I/O controller"),
        sl.capped("x", str(tmp_path), 1, cgroup_root=str(v2)),
    ):
        pass


def _usable() -> bool:
    return os.geteuid() == 0 and sl._layout(sl.CGROUP_ROOT) is not None


@pytest.mark.skipif(not _usable(), reason="needs root and a cgroup block-I/O controller")
def test_capped_puts_this_process_in_a_capped_cgroup_and_takes_it_out(tmp_path):
    """On this machine (root, as CI): inside the block the process sits in a cgroup whose read
    cap names the disk under the path; afterwards it is back and the cgroup is gone."""
    name = f"ckptflow-test-{os.getpid()}"
    disk = sl.disk_of(str(tmp_path))
    v2 = sl._layout(sl.CGROUP_ROOT)[1] == "io.max"
    home = sl._own_cgroup(v2)
    with sl.capped(name, str(tmp_path), 64) as folder:
        knob = sl._layout(sl.CGROUP_ROOT)[1]
        with open(os.path.join(folder, knob)) as f:
            line = f.read()
        with open(os.path.join(folder, "cgroup.procs")) as f:
            assert str(os.getpid()) in f.read().split()
    assert disk in line and str(64 << 20) in line, line
    assert not os.path.exists(folder)
    assert sl._own_cgroup(v2) == home  # back where it came from, not the hierarchy's root


def test_a_process_s_own_cgroup_is_read_per_hierarchy(tmp_path):
    proc = tmp_path / "cgroup"
    proc.write_text("12:memory:/pods/a\n4:cpu,blkio:/pods/b\n0::/pods/c\n")
    assert sl._own_cgroup(False, str(proc)) == "/pods/b"
    assert sl._own_cgroup(True, str(proc)) == "/pods/c"
    proc.write_text("12:memory:/pods/a\n")
    assert sl._own_cgroup(False, str(proc)) == "/"
