"""MOUNT/report.html: made on first use by `mmfs report`, kept, sized and dated as
the mount's other files."""

import os

import yaml

from golden_cases import write_case_config
from mmfs.cli import main
from mount_fixtures import mounted


def _config(tmp_path):
    path = write_case_config("p2_blend2_u16", tmp_path)
    cfg = yaml.safe_load(path.read_text())
    cfg["training"] = {"data_parallel_size": 2, "micro_batch_size": 2, "global_batch_size": 8}
    path.write_text(yaml.safe_dump(cfg))
    return path


def test_mount_serves_the_report(tmp_path):
    config = _config(tmp_path)
    assert main(["-q", "report", str(config), "-o", str(tmp_path / "cli.html")]) == 0
    with mounted(config, tmp_path / "mnt") as m:
        assert "report.html" in os.listdir(m.path)
        page = m.file("report.html")
        st = os.stat(page)
        data = page.read_bytes()
        assert st.st_size == len(data)
        assert data == (tmp_path / "cli.html").read_bytes()
        assert st.st_mtime_ns == os.stat(m.file("mmfs.json")).st_mtime_ns
        assert os.stat(page).st_size == st.st_size and page.read_bytes() == data  # kept
        assert main(["-q", "report", str(m.path), "-o", str(tmp_path / "of-mount.html")]) == 0  # MOUNT as target
        assert (tmp_path / "of-mount.html").read_bytes() == data


def test_mount_of_a_run_in_phases_serves_its_report(tmp_path):
    from test_report_phases import write

    config = write(tmp_path, "continue")
    with mounted(config, tmp_path / "mnt") as m:
        data = m.file("report.html").read_bytes()
        assert main(["-q", "report", str(m.path), "-o", str(tmp_path / "of-mount.html")]) == 0
    assert data == (tmp_path / "of-mount.html").read_bytes()
    assert data.count(b"<h3 class='phase'") == 3
