"""Figures' text: titles clear of each other and of the images, class names in any script.

From issue 24: vit-eval's attention.png with 8 images and reconstruction.png printed the figure's
title over the first row's titles (the title sat at a fraction of the figure's height, which grows
with the rows); a class folder named in Chinese came out as boxes (matplotlib's default font has no
CJK; matplotlib users meet the same: matplotlib #15062, #3806), with a warning per character. The
layout is measured with the renderer; the fonts with a font file the test writes (fontTools, a
matplotlib dependency) that has two Chinese characters, so the test needs no installed CJK font.
"""

import warnings

import pytest
import torch

pytest.importorskip("matplotlib")
from matplotlib import font_manager  # noqa: E402
from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: E402

from vit_train.viz import figures, fonts  # noqa: E402

CAT, DOG = "\u732b", "\u72d7"  # 猫, 狗


def clashes(fig) -> list[str]:
    """Pairs of the figure's texts and images whose drawn boxes overlap, and texts outside the figure."""
    FigureCanvasAgg(fig)
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    images = [(i, ax.get_window_extent(renderer)) for i, ax in enumerate(fig.axes) if ax.get_images()]
    texts = [(f"title of axes {i}", ax.title, i) for i, ax in enumerate(fig.axes) if ax.get_title()]
    if fig._suptitle is not None:
        texts.append(("figure title", fig._suptitle, None))
    found = []
    for name, text, own in texts:
        box = text.get_window_extent(renderer)
        found += [f"{name} over axes {i}" for i, image in images if i != own and box.overlaps(image)]
        found += [f"{name} over {other}" for other, t, _ in texts if t is not text and box.overlaps(
            t.get_window_extent(renderer))]
        if not fig.bbox.contains(box.x0, box.y0) or not fig.bbox.contains(box.x1, box.y1):
            found.append(f"{name} outside the figure")
    return found


def some(count: int, size: int = 32) -> torch.Tensor:
    return torch.rand(count, 3, size, size, generator=torch.Generator().manual_seed(0))


@pytest.mark.parametrize("count, depth", [(1, 1), (2, 2), (8, 4)])
def test_the_attention_figures_titles_clear_the_first_rows(count, depth):
    labels = [f"triangle\npred square 0.{i}" for i in range(count)]
    fig = figures.attention_figure(some(count), torch.rand(count, 64), torch.rand(count, depth, 64), labels, True)
    assert clashes(fig) == []


@pytest.mark.parametrize("count", [1, 8])
def test_the_reconstruction_figures_title_clears_the_first_row(count):
    assert clashes(figures.reconstruction_figure(some(count), some(count), some(count), 0.75)) == []


def test_the_other_figures_titles_clear_their_tiles():
    assert clashes(figures.heads_figure(some(1)[0], torch.rand(4, 3, 64), mean_pool=False)) == []
    assert clashes(figures.images_figure(some(10), [f"circle {i / 16:.2f}" for i in range(10)])) == []
    assert clashes(figures.filters_figure(torch.randn(16, 3, 4, 4))) == []


def write_han_font(path) -> str:
    """A TrueType font named 'Vit Test Han' with (square) glyphs for 猫 and 狗 only."""
    from fontTools.fontBuilder import FontBuilder
    from fontTools.pens.ttGlyphPen import TTGlyphPen

    names = [".notdef", "cat", "dog"]
    builder = FontBuilder(1000, isTTF=True)
    builder.setupGlyphOrder(names)
    builder.setupCharacterMap({ord(CAT): "cat", ord(DOG): "dog"})
    glyphs = {}
    for name in names:
        pen = TTGlyphPen(None)
        pen.moveTo((100, 0))
        pen.lineTo((100, 700))
        pen.lineTo((900, 700))
        pen.lineTo((900, 0))
        pen.closePath()
        glyphs[name] = pen.glyph()
    builder.setupGlyf(glyphs)
    builder.setupHorizontalMetrics({name: (1000, 100) for name in names})
    builder.setupHorizontalHeader(ascent=800, descent=-200)
    builder.setupNameTable({"familyName": "Vit Test Han", "styleName": "Regular"})
    builder.setupOS2(sTypoAscender=800, sTypoDescender=-200, usWinAscent=800, usWinDescent=200)
    builder.setupPost()
    builder.save(str(path))
    return str(path)


@pytest.fixture
def fonts_installed(monkeypatch):
    """`install(paths)`: matplotlib sees only DejaVu (its default) and the font files `paths`, for
    this test; the log's record of what it has said is fresh."""
    monkeypatch.setattr(fonts, "_said", set())

    def install(paths: list[str]) -> None:
        kept = [f for f in font_manager.fontManager.ttflist if f.name.startswith(("DejaVu", "Last Resort"))]
        monkeypatch.setattr(font_manager.fontManager, "ttflist", kept)
        for path in paths:
            font_manager.fontManager.addfont(path)
        font_manager.fontManager._findfont_cached.cache_clear()

    yield install
    font_manager.fontManager._findfont_cached.cache_clear()


def name_figures():
    """The figures that show class names: confusion (tick labels), attention (titles), images (titles)."""
    names = [CAT, DOG, "cat"]
    return [figures.confusion_figure(torch.eye(3, dtype=torch.long) * 4, names),
            figures.attention_figure(some(2), torch.rand(2, 64), torch.rand(2, 2, 64),
                                     [f"{CAT}\npred {DOG} 0.61", f"cat\npred {CAT} 0.52"], False),
            figures.images_figure(some(3), names)]


def drawn_warnings(fig) -> list[str]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        FigureCanvasAgg(fig)
        fig.canvas.draw()
    return [str(w.message) for w in caught if "missing from" in str(w.message)]


def test_a_font_that_has_the_characters_draws_them(tmp_path, fonts_installed, caplog):
    fonts_installed([write_han_font(tmp_path / "han.ttf")])
    caplog.set_level("WARNING", logger="vit_train")
    for fig in name_figures():
        assert drawn_warnings(fig) == []  # every character found a glyph
        named = [t for t in fig.findobj(lambda a: hasattr(a, "get_text")) if CAT in t.get_text()]
        assert named and all("Vit Test Han" in t.get_fontfamily() for t in named)
    assert caplog.records == []


def test_without_such_a_font_the_log_says_once_which_font_to_install(tmp_path, fonts_installed, caplog):
    fonts_installed([])
    caplog.set_level("WARNING", logger="vit_train")
    made = name_figures() + name_figures()
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 1 and f"({DOG}{CAT})" in said[0] and "fonts-noto-cjk" in said[0], said
    assert drawn_warnings(made[0])  # matplotlib's own, per character, when drawn directly ...
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        figures.save_figure(made[1], tmp_path / "attention.png")  # ... but not where vit-eval saves them
    assert [w for w in caught if "missing from" in str(w.message)] == []


def test_latin_names_change_nothing(fonts_installed, caplog):
    fonts_installed([])
    caplog.set_level("WARNING", logger="vit_train")
    assert fonts.fallback_families(["circle", "Straße", "кошка"]) == (["sans-serif"], "")
    assert caplog.records == []


def test_an_installed_font_is_found_by_its_glyphs_and_the_preferred_come_first(tmp_path, fonts_installed):
    fonts_installed([write_han_font(tmp_path / "han.ttf")])
    devanagari = "\u0915"  # neither DejaVu nor the test font has it
    assert fonts.fallback_families([f"{CAT} and {devanagari}"]) == (["sans-serif", "Vit Test Han"], devanagari)
