"""The launch-script reader against bash itself (issue 44): for each snippet, the words the reader gives verl are
the words `bash -c` gives a command for the same text; and what bash cannot tell without running is named."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from rollout8.runspec.shell_arith import ArithError, evaluate
from rollout8.runspec.shell_script import read_script

BASH = shutil.which("bash")

# (assignments before the command, the command's arguments): every operator of issue 44 items 1-3
SNIPPETS = [
    ('RAY_DATA_HOME=${RAY_DATA_HOME:-"${HOME}/verl"}', "d=$RAY_DATA_HOME"),
    ("MODEL_ID=Qwen; MODEL_PATH=${MODEL_PATH:-${HOME}/models/${MODEL_ID}}", "m=$MODEL_PATH"),
    ('X=${X:-"/data/verl"}', "data.train_files=$X/t.parquet"),
    ("", '"${X:-"/a b"}"'),
    ("", "${U:-'a b'}"),
    ("", '"${U:-\'a b\'}"'),
    ("", '${U:-"a b"}'),
    ("", "${U:-a b}"),
    ("", '"${U:-\\"x\\"}"'),
    ("u=", '"${u-def}" "${u:-def}" "${u+alt}" "${u:+alt}" ${u:+alt}'),
    ("", "${V:=set} $V"),
    ("V=", "${V=set}. ${V:=again}"),
    ("X=hello.tar.gz", '"${X#*.}" "${X##*.}" "${X%.*}" "${X%%.*}"'),
    ("X=hello.tar.gz", '"${X#"*."}" ${X#h?l} ${X%[a-z][a-z]} ${X##*[!a-z.]}'),
    ("X=hello.tar.gz", '"${X/l/L}" "${X//l/L}" "${X/#h/H}" "${X/%gz/GZ}" "${X//[lo]/_}" "${X/l}"'),
    ("X=hello.tar.gz", "\"${X/#/pre}\" \"${X//}\" \"${X/l/&&}\" \"${X/l/\\&}\" ${X/l/\"&\"} \"${X/l/'L'}\""),
    ("X=Hello", '"${X^^}" "${X,,}" "${X^}" "${X,}" "${#X}"'),
    ("X=hello.tar.gz", '"${X:1:3}" "${X: -2}" "${X:(-2)}" "${X:2}" "${X:0:-3}"'),
    ("P='*.'; X=a.b.c", "${X#$P} ${X##$P} \"${X#\"$P\"}\""),
    ("X=a/b/c", "${X%/*} ${X##*/} ${X//\\//:}"),
    ("", '"${U:-${X:-${Y:-deep}}}" ${U:-$((1+1))} "${U:-"${V:-"in quotes"}"}"'),
    ("X=hello.tar.gz", '"${U:-${X%%.*}}"'),
    ("N=4", "n=$((1024 * 2)) $(( 2**10 )) $((7/2)) x$((-7/2)) x$((-7%3)) $((1<<3)) $((N*N+1)) $((N-1))"),
    ("i=2; X=3+4", "$((i ? 3 : 4)) x$((~0)) $((!0)) $((X*2)) $((-2**2)) $((2**3**2)) $(( (1+2)*3 ))"),
    ("N=8", "$((0x10+010+2#101)) $((1?2:0?3:4)) $((5>3&&2<1||1)) $((N%3 == 2)) $((N>>1 | 1)) $((N^3&7))"),
    ("N=8", "$((a=b=4)) $a $b $((N+=2)) $N $((N++)) $N $((--N))"),
    ("TP=4; NODES=2", "trainer.n_gpus_per_node=$((TP * 2)) trainer.nnodes=$(( $NODES ))"),
    ("L=1024", "data.max_prompt_length=$((L * 2)) data.max_response_length=$(( ${L} * 8 ))"),
    ('a=(x y "z w"); a+=(v)', '"${a[@]}"'),
    ('a=(x y "z w"); a+=(v)', "${a[*]}"),
    ('a=(x y "z w")', '"${a[*]}" ${#a[@]} "${a[1]}" "${a[-1]}" "${a}" ${#a[2]}'),
    ('a=(x y "z w"); i=2', '"${a[i]}" "${a[$i]}" "${a[i-1]}"'),
    ('args=(data.a=1 "data.b=two words"); args+=(data.c=3)', '"${args[@]}" tail=1'),
    ('b=(x "y z")', '"${b[@]/y/Y}" ${b[@]/y/Y} "${b[*]/y/Y}" "${b[@]^}" "${b[@]%z}"'),
    ("a=()", '"${a[@]}" "${a[@]:-d}" ${#a[@]} "x${a[@]}"'),
    ('a=("")', '"${a[@]:-d}" "${a[@]-d}"'),
    ("Y='a  b'", '$Y "$Y" x${Y}y'),
    ("S=' lead'", "$S x$S"),
    ("", '"$@" x"$@"y "$@""" $# ${1:-one} "${2:-two}"'),
    ("A=1", "'$A' \"$A\" \\$A a\\ b \"a\\\"b\" 'it'\\''s'"),
    ("X=v", "k=$X k.l=$X ++k=\"${X}\" '+k=[\"a\",\"b\"]' k=['x','y']"),
    ("A=/data; export B=$A/b", "${B}/c ${A:+$A/x}"),
    ("A=a:b:c", '"${A//:/ }" ${A//:/ }'),
    ('V="${HOME2:-/root}/x"', "$V"),
    ('A=x; A+=y; a=(1); a+=(2 3)', '$A "${a[@]}"'),
    ("d=/data", "~notexpanded ${d}/*.parquet 'a*' [x]"),
]


ENV = {"HOME": "/home/u"}  # given to both: the reader reads no environment it is not given


def reader_words(tmp_path: Path, setup: str, word: str, env: dict[str, str] | None = None) -> list[str]:
    script = tmp_path / "s.sh"
    script.write_text(f"{setup}\npython3 -m verl.trainer.main_ppo {word}\n")
    reading = read_script(script, env=env)
    assert reading.command is not None, [d.describe() for d in reading.dropped]
    assert reading.failures == [], [d.describe() for d in reading.failures]
    return reading.command.args


def bash_words(tmp_path: Path, setup: str, word: str) -> list[str]:
    run = tmp_path / "empty"
    run.mkdir(exist_ok=True)
    text = f"{setup}\nfor w in {word}; do printf '%s\\0' \"$w\"; done"
    out = subprocess.run([BASH, "-c", text], cwd=run, env={"PATH": "/usr/bin:/bin", **ENV}, capture_output=True,
                         text=True, check=True).stdout
    return out.split("\0")[:-1]


def test_the_table_is_large_enough():
    assert len(SNIPPETS) >= 40


@pytest.mark.skipif(BASH is None, reason="no bash on this machine")
@pytest.mark.parametrize(("setup", "word"), SNIPPETS, ids=[f"{n:02d}" for n in range(len(SNIPPETS))])
def test_the_reader_gives_the_words_bash_gives(setup, word, tmp_path):
    expected = bash_words(tmp_path, setup, word)
    assert reader_words(tmp_path, setup, word, ENV) == expected


def test_a_quoted_default_loses_its_quotes(tmp_path):
    """Before issue 44: `"/data/verl"/t.parquet`, with literal quotes, and exit 0."""
    assert reader_words(tmp_path, 'X=${X:-"/data/verl"}', "data.train_files=$X/t.parquet") == [
        "data.train_files=/data/verl/t.parquet"]


def test_a_nested_default_is_read_and_an_unset_home_stays_named(tmp_path):
    """Before issue 44: "unterminated ${" (the first `}` was taken as the end)."""
    script = tmp_path / "s.sh"
    script.write_text('MODEL_ID=Qwen2.5-7B\nMODEL_PATH=${MODEL_PATH:-${HOME}/models/${MODEL_ID}}\n'
                      'RAY_DATA_HOME=${RAY_DATA_HOME:-"${HOME}/verl"}\n'
                      'python3 -m verl.trainer.main_ppo m=$MODEL_PATH d="$RAY_DATA_HOME/data"\n')
    reading = read_script(script)
    assert reading.failures == []
    assert reading.command.args == ["m=$HOME/models/Qwen2.5-7B", "d=$HOME/verl/data"]
    assert {d.reason.split(" ")[0] for d in reading.unresolved} == {"$HOME"}
    given = read_script(script, env={"HOME": "/home/ma"})
    assert given.command.args == ["m=/home/ma/models/Qwen2.5-7B", "d=/home/ma/verl/data"] and not given.unresolved


def test_arithmetic_evaluates_and_never_guesses(tmp_path):
    assert reader_words(tmp_path, "", "max_prompt_length=$((1024 * 2))") == ["max_prompt_length=2048"]
    variables = {"N": "3"}
    assert evaluate("N * (N + 1) / 2", variables.get, variables.__setitem__) == 6
    for text, why in (("1 / 0", "division by 0"), ("UNSET + 1", "$UNSET, which is not set"), ("2 ** -1", "exponent")):
        with pytest.raises(ArithError, match=why.replace("$", r"\$")):
            evaluate(text, variables.get, variables.__setitem__)
    script = tmp_path / "s.sh"
    script.write_text("L=$((1024 / ZERO))\nM=$(( $UNSET * 2 ))\npython3 -m verl.trainer.main_ppo a=$L b=$M\n")
    reasons = [d.reason for d in read_script(script).failures]
    assert any("$ZERO, which is not set" in r for r in reasons) and any("$UNSET" in r for r in reasons)


def test_arrays_give_one_word_per_element(tmp_path):
    script = tmp_path / "s.sh"
    script.write_text('common=(\n  data.train_batch_size=16   # a comment\n  "trainer.logger=[\'console\']"\n)\n'
                      'common+=(trainer.nnodes=1)\npython3 -m verl.trainer.main_ppo "${common[@]}" n=${#common[@]}\n')
    reading = read_script(script)
    assert reading.failures == []
    assert reading.command.args == ["data.train_batch_size=16", "trainer.logger=['console']", "trainer.nnodes=1",
                                    "n=3"]


def test_what_needs_running_is_named_not_guessed(tmp_path):
    script = tmp_path / "s.sh"
    script.write_text("N=$(nproc)\nX=${U:?need U}\nY=`hostname`\nZ=${!P*}\n"
                      "python3 -m verl.trainer.main_ppo a=$N b=$X c=$Y\n")
    reading = read_script(script)
    reasons = {d.line: d.reason for d in reading.failures}
    assert "command substitution $(nproc)" in reasons[1] and "stops the script" in reasons[2]
    assert "command substitution" in reasons[3] and "${!P*}" in reasons[4]
    assert reading.command.args == ["a=$N", "b=$X", "c=$Y"]  # unknown from there on: kept as written, named


def test_a_here_document_is_data_and_a_shift_is_not_one(tmp_path):
    script = tmp_path / "s.sh"
    script.write_text("cat > /tmp/x.yaml <<'EOF'\nexport NOT_A_COMMAND=1\nEOF\nN=2\nB=$((1 << N))\n"
                      "python3 -m verl.trainer.main_ppo b=$B\n")
    reading = read_script(script)
    assert reading.command.args == ["b=4"] and reading.command.env == {}
    assert [d.line for d in reading.failures] == [1]  # cat: named, its document not read as commands


# (assignments, the test of an if): the branch the reader takes is the one bash takes
CONDITIONS = [
    ('D=npu', '[ "$D" = "npu" ]'), ('D=gpu', '[ "$D" = "npu" ]'), ('D=gpu0', '[[ $D == gpu* ]]'),
    ('D=gpu0', '[[ $D == "gpu*" ]]'), ('D=', '[[ $D == "" ]]'), ('D=', '[ -z "$D" ]'), ('D=x', '[ -n "$D" ]'),
    ('N=8', '[ "$N" -gt 4 ]'), ('N=8', '[ $N -le 4 ] || [ $N -eq 8 ]'), ('N=8', '[ $N -ne 8 ] && [ $N -eq 8 ]'),
    ('N=8', '! [ $N -lt 4 ]'), ('N=8', '[ ! $N -lt 4 ]'), ('A=1 B=', '[ -n "$A" -a -z "$B" ]'),
    ('A=1 B=', '[[ -n $A && -n $B ]]'), ('A=1 B=', '[[ -n $A || -n $B ]]'), ('X=7b', 'test "$X" != 32b'),
    ('', 'true && false'), ('', 'false || true'), ('T=4', '[ $((T * 2)) -ge 8 ]'), ('E=', '[ -z "${E:-}" ]'),
]


@pytest.mark.skipif(BASH is None, reason="no bash on this machine")
@pytest.mark.parametrize(("setup", "test"), CONDITIONS, ids=[f"{n:02d}" for n in range(len(CONDITIONS))])
def test_the_branch_taken_is_the_one_bash_takes(setup, test, tmp_path):
    text = f"{setup}\nif {test}; then R=then; else R=else; fi\n"
    expected = subprocess.run([BASH, "-c", text + 'printf "%s" "$R"'], env={"PATH": "/usr/bin:/bin"},
                              capture_output=True, text=True, check=True).stdout
    assert reader_words(tmp_path, text, "r=$R") == [f"r={expected}"]
