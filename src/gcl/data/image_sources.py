"""What the image sources (gcl.data.cifar_sources, gcl.data.tinyimagenet_sources) share: their normalisation
constants, their archive settings and the way to a verified archive.

Every archive is checked against its published MD5 before it is read, so a truncated download or a foreign file
stops the stage with a message that names the file and says how to supply a good one. Settings (under
`sources.<name>` in params.yaml), all optional:
    download: true        fetch what is missing or damaged (false: only use files already in place; an
                          intact archive in download_dir is checked and used either way; a damaged one that
                          no download can replace is named, with its size and the MD5 it fails)
    url: <mirror>         where to fetch the archive from instead of the canonical address
    archive: <path>       a local copy of the archive (checked like a download)
    download_dir: <dir>   where archives are kept and extracted (default data/downloads, outside DVC)
Each source also records its dataset's normalisation constants (docs/protocol.md), so that a benchmark built
from it normalises with the right mean and std.
"""
from __future__ import annotations

from pathlib import Path

from pydantic import Field

from gcl.data.source_registry import SourceError, SourceSettings

# torchvision is imported inside the functions that read or download files: importing it takes about
# a second (it pulls in torch._dynamo), which every train stage would otherwise pay for nothing.

# mean / std per channel, in [0, 1] units, as the reference framework (mammoth) normalises
NORMALIZATION = {
    "cifar10": ((0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2615)),
    "cifar100": ((0.5071, 0.4867, 0.4408), (0.2675, 0.2565, 0.2761)),
    "tinyimagenet": ((0.4802, 0.4480, 0.3975), (0.2770, 0.2691, 0.2821)),
}


def stats(name: str) -> dict:
    mean, std = NORMALIZATION[name]
    return {"mean": list(mean), "std": list(std)}


class ArchiveSourceSettings(SourceSettings):
    archive: str | None = Field(None, description="a local copy of the archive to use instead of downloading")
    url: str | None = Field(None, description="a mirror to download the archive from")


def locate_archive(name: str, settings: ArchiveSourceSettings, root: Path, filename: str, md5: str, url: str,
                   fix: str, problem: str = "", folder_ok: bool = False) -> Path:
    """The archive of source `name` to read, verified by its `md5`: the one `settings.archive` names (with
    `folder_ok`, an extracted folder there is returned as it is, unchecked), else the one at `root / filename`,
    else a download from `settings.url` or `url` (when `settings.download`; it replaces a damaged one in place).
    Otherwise a SourceError that starts with `problem` (what made the archive necessary) and ends with `fix` (how
    to supply it); where a download fails over a file in place that fails its MD5, it names that file as the
    problem (not the download), with its size."""
    from torchvision.datasets.utils import check_integrity, download_url
    lead = f"{problem}; " if problem else ""
    if settings.archive:
        archive = Path(settings.archive)
        if folder_ok and archive.is_dir():
            return archive
        if not archive.is_file():
            raise SourceError(f"{lead}sources.{name}.archive: {archive} does not exist. {fix}")
        if not check_integrity(str(archive), md5):
            raise SourceError(f"{lead}{archive} is not the original {filename}: it does not match the MD5 {md5} "
                              f"(truncated or another file). {fix}")
        return archive
    archive = root / filename
    if check_integrity(str(archive), md5):   # an intact archive in place: usable without download
        return archive
    if not settings.download:
        state = (f"{archive} is there but does not match its published MD5 {md5} (truncated or not the original "
                 f"file)" if archive.exists() else f"{archive} is missing")
        raise SourceError(f"{lead}{state}, and sources.{name}.download is false. {fix}")
    url = settings.url or url
    damaged = _damaged(archive, md5)    # before download_url, which may overwrite it
    try:  # download_url replaces a copy that does not match the MD5, and verifies a fresh download
        download_url(url, str(root), filename=filename, md5=md5)
    except Exception as exc:
        if damaged:   # the file in place is the problem: advice to put the file there would send the user in circles
            raise SourceError(f"{lead}{damaged}, and no fresh copy could be downloaded from {url} ({exc}): delete "
                              f"{archive}, or replace it with the original {filename}. {fix}") from exc
        raise SourceError(f"{lead}could not download {url} (MD5 {md5}) to {archive} ({exc}). {fix}") from exc
    return archive


def _damaged(archive: Path, md5: str) -> str:
    """What is wrong with an archive in place that failed its MD5 (its size, which shows a truncated copy, and
    the MD5 it lacks); empty where there is no file."""
    if not archive.is_file():
        return ""
    return (f"{archive} is in place but is not the original file: its checksum does not match the MD5 {md5} "
            f"({archive.stat().st_size:,} bytes; truncated, damaged or another file)")
