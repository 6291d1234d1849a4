"""Fonts for class names in figures, in any script.

matplotlib's default font (DejaVu Sans) has Latin, Greek and Cyrillic but no Chinese, Japanese,
Korean, Arabic or Devanagari: a class folder named `猫` (as many who learn ViT from tutorials name
theirs) came out as boxes, with one matplotlib warning per character. `fonts_for(names)` puts,
after the default, installed fonts that have the missing characters into matplotlib's font
fallback list (matplotlib >= 3.6 draws each character from the first font in the list that has
it), preferring the common ones (Noto Sans CJK, Source Han Sans, WenQuanYi, Droid Sans Fallback,
...), else any installed font that has them. When none has them, the log says once which
characters cannot be drawn and which font to install.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import warnings
from collections.abc import Iterable, Iterator

log = logging.getLogger("vit_train")

PREFERRED = (
    "Noto Sans CJK SC",
    "Noto Sans CJK JP",
    "Noto Sans CJK TC",
    "Noto Sans CJK KR",
    "Noto Sans SC",
    "Source Han Sans SC",
    "Source Han Sans",
    "WenQuanYi Zen Hei",
    "WenQuanYi Micro Hei",
    "Droid Sans Fallback",
    "Microsoft YaHei",
    "SimHei",
    "PingFang SC",
    "Hiragino Sans GB",
    "Apple SD Gothic Neo",
    "Malgun Gothic",
    "Arial Unicode MS",
    "Noto Sans",
    "Noto Sans Arabic",
    "Noto Sans Hebrew",
    "Noto Sans Devanagari",
    "Noto Sans Thai",
)
NOT_TEXT = ("Last Resort",)  # matplotlib's own last resort draws a box for every character
_said: set[str] = set()  # the missing characters the log has named already


@functools.cache
def charmap(path: str) -> frozenset[int]:
    """The code points the font file at `path` has glyphs for (empty when it cannot be read)."""
    from matplotlib.ft2font import FT2Font

    try:
        return frozenset(FT2Font(path).get_charmap())
    except (OSError, RuntimeError, ValueError):
        return frozenset()


def fallback_families(texts: Iterable[str]) -> tuple[list[str], str]:
    """(matplotlib's font.family for `texts`: the default families, then the installed families that
    have the characters the default font lacks; the characters that no installed font has)."""
    from matplotlib import font_manager, rcParams

    families = list(rcParams["font.family"])
    default = font_manager.findfont(font_manager.FontProperties(family=families))
    missing = {c for text in texts for c in text if not c.isspace() and ord(c) not in charmap(default)}
    if not missing:
        return families, ""
    rank = {name: i for i, name in enumerate(PREFERRED)}
    installed = sorted(
        (f for f in font_manager.fontManager.ttflist if not f.name.startswith(NOT_TEXT)),
        key=lambda f: (rank.get(f.name, len(rank)), f.name, f.fname),
    )
    for font in installed:
        has = {c for c in missing if ord(c) in charmap(font.fname)}
        if has and font.name not in families:
            families.append(font.name)
            missing -= has
        if not missing:
            break
    return families, "".join(sorted(missing))


@contextlib.contextmanager
def fonts_for(texts: Iterable[str]) -> Iterator[None]:
    """Figures made inside this context draw `texts` (class names) with installed fonts that have
    their characters; when no installed font has some of them, one warning in the log (once per set
    of characters) names them and the font to install. Text keeps the fonts it was made with, so a
    figure drawn later (savefig, TensorBoard) draws them the same."""
    from matplotlib import get_cachedir, rc_context, rcParams

    families, missing = fallback_families(texts)
    if missing and missing not in _said:
        _said.add(missing)
        log.warning(
            "class names hold characters that no installed font has (%s): the figures draw them "
            "as boxes; install a font that has them (Chinese, Japanese, Korean: fonts-noto-cjk or "
            "fonts-wqy-zenhei; other scripts: the Noto Sans font of the script), then delete matplotlib's "
            "font cache (%s) so that it finds the new font",
            missing[:20],
            get_cachedir(),
        )
    if families == list(rcParams["font.family"]):
        yield
        return
    with rc_context({"font.family": families}):
        yield


@contextlib.contextmanager
def quiet_missing_glyphs() -> Iterator[None]:
    """While drawing: no matplotlib warning per missing character (fonts_for has said it once)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"Glyph \d+ .*missing from", category=UserWarning)
        yield
