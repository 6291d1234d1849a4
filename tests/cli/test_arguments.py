"""Command-line values: every command reads them with the same grammar (Hydra's overrides); paths with
'=', '#', spaces, commas, brackets, quotes and non-ASCII letters work when quoted as the docs show; an
argument that cannot be read gets one line naming it and the quoting that works, exit status 2."""

import json
import subprocess
import sys

import pytest
from helpers.configs import composed
from helpers.files import read_results
from helpers.runs import vit_train

from vit_train.cli import arguments, train as cli, commands
from vit_train.cli.compose import read
from vit_train.errors import ConfigError

NASTY = ["/tmp/a=b", "/tmp/photo #1.png", "/tmp/my data", "/tmp/a,b", "/tmp/[x]", "/tmp/café", "/tmp/日本",
         "~/data", "/tmp/it's", '/tmp/say "hi"', "/tmp/$HOME", "/tmp/back\\slash", "/tmp/a&b;c", "/tmp/`x`"]


def through_bash(text: str) -> list[str]:
    """The arguments a shell command line gives a program."""
    done = subprocess.run(["bash", "-c", f'for a in {text}; do printf "%s\\0" "$a"; done'], capture_output=True,
                          text=True, check=True)
    return done.stdout.split("\0")[:-1]


@pytest.mark.parametrize("path", NASTY)
def test_the_quoting_the_error_names_gives_back_the_path(path):
    (arg,) = through_bash(arguments.quoted("data.root", path))
    assert arguments.parse_override(arg) == ("data.root", path)


def test_a_list_of_nasty_paths_quoted_as_shown():
    (arg,) = through_bash(arguments.quoted("images", "[" + ",".join(NASTY[:3] + NASTY[5:7]) + "]"))
    assert arguments.parse_override(arg) == ("images", NASTY[:3] + NASTY[5:7])


@pytest.mark.parametrize("arg, why, fix", [
    ("images=[/tmp/x/photo #1.png]", "'#' needs quotes", """'images=["/tmp/x/photo #1.png"]'"""),
    ("data.root=/data/a=b", "'=' needs quotes", """"data.root='/data/a=b'\""""),
    ("data.root=/data/café", "'é' needs quotes", """"data.root='/data/café'\""""),
    ("data.root=/data/[x]", "'[' needs quotes", """"data.root='/data/[x]'\""""),
    ("data.root=~/data", "'~' needs quotes", """"data.root='~/data'\""""),
])
def test_an_unreadable_value_is_one_line_naming_the_argument_and_the_quoting(arg, why, fix):
    with pytest.raises(ConfigError) as info:
        arguments.parse_override(arg)
    message = str(info.value)
    assert message.startswith(f"cannot read the argument {arg!r} ({why}); quote the value, e.g. {fix} ")
    assert "\n" not in message
    (fixed,) = through_bash(fix)
    assert arguments.parse_override(fixed)[0] == arg.split("=")[0]


def test_a_comma_is_a_sweep_only_with_minus_m():
    with pytest.raises(ConfigError, match=r"""is a sweep over several values .* e.g. "data.root='/d/a,b'", or add -m"""):
        read(["data=imagefolder", "data.root=/d/a,b"])
    assert not read(["data=imagefolder", "data.root='/d/a,b'"]).multirun and read(["-m", "optim.lr=1e-3,5e-4"]).multirun
    read(["-m", "optim.lr=1e-3,5e-4"])
    read(["data=imagefolder", "data.root='/d/a,b'"])


@pytest.mark.parametrize("main, args", [
    (cli.train_main, ["data=imagefolder", "data.root=/data/photo #1"]),
    (commands.eval_main, ["ckpt=/runs/a=b/last.pt"]),
    (commands.predict_main, ["ckpt=x.pt", "images=[/tmp/x/photo #1.png]"]),
    (commands.export_main, ["ckpt=/runs/é/last.pt"]),
])
def test_every_command_refuses_with_one_line_and_exit_2(main, args, monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["prog", *args])
    with pytest.raises(SystemExit) as info:
        main()
    err = capsys.readouterr().err
    assert info.value.code == 2
    assert err.count("\n") == 1 and "cannot read the argument" in err and "quote the value, e.g." in err


@pytest.mark.parametrize("args", [["15"], ["model.depth"], ["model=vit_micro", "vit_tiny"]])
def test_a_bare_word_is_one_line_and_exit_2_not_hydras_parser_trace(args, monkeypatch, capsys):
    """`vit-train 15` printed Hydra's LexerNoViableAltException and its grammar link, exit 1."""
    monkeypatch.setattr(sys, "argv", ["vit-train", *args])
    with pytest.raises(SystemExit) as info:
        cli.train_main()
    err = capsys.readouterr().err
    assert info.value.code == 2 and err == (f"vit-train: error: {args[-1]!r} is not an override: vit-train takes "
                                            f"key=value (model.depth=12) and group=option (model=vit_tiny) "
                                            f"arguments; see vit-train --help\n")
    read(["--cfg", "job", "model=vit_micro"])  # a flag's value is no override


def test_all_commands_read_values_the_same_way():
    """vit-eval's data.* values equal what vit-train composes from the same arguments (1e-2 is a number)."""
    args = ["data.max_bad_fraction=1e-2", "data.root='/d/a=b, [c] #1 é'", "data.num_workers=null",
            "data.bad_images=error", "data.batch_size=64"]
    _, overrides = commands.parse_args(args, {"ckpt": None}, config=True)
    train_data = composed(["data=imagefolder", *args])["data"]
    assert overrides["data"] == {k: train_data[k] for k in overrides["data"]}
    assert overrides["data"]["max_bad_fraction"] == 0.01


def test_a_value_split_by_the_shell_is_refused_with_the_quoting():
    with pytest.raises(ConfigError, match=r"'run/last.pt' is not key=value .* needs quotes"):
        commands.parse_args(["ckpt=/tmp/my", "run/last.pt"], {"ckpt": ...})


@pytest.mark.slow  # in the slow suite to keep `pytest` near 5 minutes on 2 cores
def test_every_command_works_on_nasty_paths_quoted_as_shown(tmp_path, monkeypatch, capsys):
    """vit-train (data.root, hydra.run.dir, resume), vit-eval, vit-predict and vit-export, each given
    paths with '=', '#', spaces, commas, brackets and non-ASCII letters, quoted as the docs show."""
    from PIL import Image
    from helpers.ugly_folder import picture, write_ugly_folder

    data = write_ugly_folder(tmp_path / "my data #1, [a]=b é", modes=False).root
    run = tmp_path / "run #1, [x]=y é"
    tiny = ["model.img_size=16", "model.patch_size=4", "model.embed_dim=32", "model.depth=1", "model.num_heads=2",
            "data.batch_size=2", "data.num_workers=0", "trainer.device=cpu", "trainer.progress=false"]
    done = vit_train("data=imagefolder", f"data.root='{data}'", *tiny, "trainer.max_steps=1",
                     f"hydra.run.dir='{run}'", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    again = vit_train(f"resume='{run}'", "trainer.max_steps=2", cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    assert read_results(run)["steps"] == 2
    ckpt = run / "checkpoints" / "last.pt"

    def command(main, *args):
        monkeypatch.setattr(sys, "argv", ["prog", *args, "--json"])
        main()
        return json.loads(capsys.readouterr().out)

    evaluated = command(commands.eval_main, f"ckpt='{ckpt}'", f"data.root='{data}'", f"out='{tmp_path / 'eval é'}'")
    assert evaluated["images"] == 4
    photos = [tmp_path / "photo #1.png", tmp_path / "a,b=c [é].png"]
    for path in photos:
        Image.fromarray(picture(1)).save(path)
    predicted = command(commands.predict_main, f"ckpt='{ckpt}'", "images=[" + ",".join(f'"{p}"' for p in photos) + "]")
    assert [p["file"] for p in predicted] == [str(p) for p in photos]
    out = tmp_path / "export #1, é" / "w.safetensors"
    pytest.importorskip("safetensors")
    assert command(commands.export_main, f"ckpt='{ckpt}'", f"out='{out}'")["path"] == str(out)
    assert out.is_file()


@pytest.mark.parametrize("arg, value", [
    ("data.root=/data/pattern_%r.bin", "/data/pattern_%r.bin"),  # hydra-ecosystem/hydra#962
    ("data.root=/data/user@example.com", "/data/user@example.com"),  # hydra-ecosystem/hydra#1074
    ("data.root=/data/a:b+c?d", "/data/a:b+c?d"),
    ("data.root=/data/my photos", "/data/my photos"),  # one shell argument with a space needs no Hydra quotes
])
def test_what_the_grammar_reads_unquoted_is_not_refused(arg, value):
    assert arguments.parse_override(arg) == ("data.root", value)
