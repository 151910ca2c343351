"""Read a bash launch script statically, never running it: which command launches Megatron, with
which words, after the script's own variables are expanded.

Users keep their launch in a script (Megatron-LM's examples/, the Megatron-MoE-ModelZoo and
Pai-Megatron-Patch recipes): `VAR=value`, `export`, `${VAR:-default}`, bash arrays and
`"${ARR[@]}"`, `$((…))` arithmetic, line continuations, comments, `#SBATCH` lines, and a
`torchrun … pretrain_gpt.py …` (or `eval $CMD`) at the end. This module is a small interpreter of
exactly that much bash: every statement runs in order (both branches of an `if`: a static read
cannot know which runs, the later assignment wins), and what it cannot know — `$(…)`, a variable
the script never sets, a positional `$1` — is kept as `${NAME}` in the word and listed in
`Unresolved`, so the caller can name it with `--set NAME=VALUE` as the fix.

Every step is bounded (the budgets below): a script a few hundred bytes long can double a string
or an array thirty times, nest `${a:-${b:-…}}` defaults thousands deep or multiply numbers into
millions of digits. An overrun stops the read with ScriptTooComplex naming the line and the
budget; nothing is evaluated further.
"""

from __future__ import annotations

import ast
import fnmatch
import re
from dataclasses import dataclass, field

from planner.config.importers.shell_words import shell_words

Value = str | list[str]

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_ASSIGNMENT = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)(\[[^\]]*\])?(\+?=)")
_KEYWORDS = {"if", "then", "else", "elif", "fi", "do", "done", "while", "until", "!", "{", "}",
             "time", "exec", "nohup", "command"}
_DECLARE = {"export", "declare", "local", "readonly", "typeset"}
_SEPARATORS = {";", "&", "|", "&&", "||", "|&", ";;"}
ENTRY_SUFFIX = ".py"


NOT_SET = "not set in the file (an environment variable, or set elsewhere)"

# Budgets of one read, each far beyond a real launch script (a few KiB, a few hundred words).
MAX_VALUE_CHARS = 1 << 20  # one expanded word or variable value
MAX_ARRAY_ITEMS = 100_000  # one array's elements
MAX_WORK_CHARS = 64 << 20  # every character all expansions of the read produce together
MAX_DEPTH = 64  # `${a:-${b:-…}}` defaults, and `( … )` arrays, nested in one another
MAX_ARITHMETIC_CHARS = 1_000  # one `$(( … ))` after its variables are put in
INT_BITS = 64  # bash's arithmetic is intmax_t: it wraps at 64 bits, and so does this reader


class ScriptTooComplex(Exception):
    """The script exceeds a budget of the static read (the message names the line and the
    budget); the caller refuses the import (exit 2)."""

    def __init__(self, line: int | str, what: str) -> None:
        where = f"line {line}" if isinstance(line, int) else str(line)
        super().__init__(f"{where}: {what}; moeplan reads launch scripts statically and stops "
                         "there: give the value with --set NAME=VALUE or simplify the script")


class Unknown(str):
    """A value the script computes at run time (`$(hostname)`, `$RANDOM`): known only by its why."""


@dataclass(frozen=True)
class Segment:
    kind: str  # "lit", "var" (${...} body), "cmd" ($(...) or `...`), "arith" ($((...)))
    text: str
    quoted: bool


@dataclass
class Word:
    segments: list[Segment] = field(default_factory=list)
    array: list[Word] | None = None  # NAME=( … ): the elements

    @property
    def literal(self) -> str | None:
        if all(s.kind == "lit" for s in self.segments):
            return "".join(s.text for s in self.segments)
        return None


@dataclass
class Unresolved:
    """A variable (or `$(…)`) whose value the script does not give."""

    name: str
    why: str


@dataclass
class Command:
    """One simple command after expansion: its words and the assignments that prefix it."""

    words: list[str]
    env: dict[str, str]
    line: int
    unresolved: dict[str, Unresolved] = field(default_factory=dict)


@dataclass
class ShellRead:
    commands: list[Command]
    variables: dict[str, Value]
    sbatch: dict[str, str]  # `#SBATCH --nodes=4` → {"nodes": "4"} (long option names)
    included: list[str]  # files the script sources (not followed)
    deciders: dict[str, Unresolved]  # unknowns whose `if` / `case` ran every branch
    conflicts: list[str]  # variables such undecided branches set differently
    assumed_unset: list[str]  # environment variables `[ -z $X ]` tests read as unset
    carried: dict[str, dict[str, Unresolved]]  # what each variable's value holds unresolved


# ---------------------------------------------------------------------------------------- lexer
class _Lexer:
    """Bash words and statement boundaries (newline, `;`, `&&`, `|`, …), arrays, here-documents."""

    def __init__(self, text: str, depth: int = 0) -> None:
        self.text = text
        self.pos = 0
        self.line = 1
        self.depth = depth  # arrays nested at the current word

    def peek(self, ahead: int = 0) -> str:
        at = self.pos + ahead
        return self.text[at] if at < len(self.text) else ""

    def take(self) -> str:
        char = self.peek()
        self.pos += 1
        if char == "\n":
            self.line += 1
        return char

    def statements(self) -> list[tuple[int, list[Word], str]]:
        """(line, words, the operator that ended the statement: newline, `;`, `&&`, `)`, …)."""
        out: list[tuple[int, list[Word], str]] = []
        words: list[Word] = []
        start = self.line
        heredocs: list[tuple[str, bool]] = []
        drop_next = False
        while self.pos < len(self.text):
            char = self.peek()
            if char in " \t\r":
                self.take()
                continue
            if char == "\\" and self.peek(1) == "\n":
                self.take(), self.take()
                continue
            if char == "#":
                while self.peek() not in ("", "\n"):
                    self.take()
                continue
            if char == "\n" or char in ";&|" or char in "()":
                op = self.take()
                if op in ";&|" and self.peek() in ";&|":
                    op += self.take()
                if words or op in (";;", ")"):
                    out.append((start, words, op))
                words = []
                if op == "\n":
                    for delimiter, strip in heredocs:
                        self._skip_heredoc(delimiter, strip)
                    heredocs = []
                start = self.line
                continue
            if char in "<>":
                op = self.take()
                if self.peek() == op and op == "<":
                    self.take()
                    strip = self.peek() == "-"
                    if strip:
                        self.take()
                    while self.peek() in " \t":
                        self.take()
                    target = self.word()
                    heredocs.append(((target.literal or "").strip("'\""), strip))
                    continue
                while self.peek() in "<>&":
                    self.take()
                if words and (words[-1].literal or "x").isdigit():
                    words.pop()  # `2>&1`: the file descriptor is no word
                drop_next = True  # the redirection's target is no word of the command
                continue
            word = self.word()
            if drop_next:
                drop_next = False
                continue
            words.append(word)
        if words:
            out.append((start, words, "\n"))
        return out

    def _skip_heredoc(self, delimiter: str, strip: bool) -> None:
        while self.pos < len(self.text):
            end = self.text.find("\n", self.pos)
            end = len(self.text) if end < 0 else end
            line = self.text[self.pos:end]
            self.pos = end + 1
            self.line += 1
            if (line.lstrip("\t") if strip else line) == delimiter:
                return

    def word(self) -> Word:
        word = Word()
        while self.pos < len(self.text):
            char = self.peek()
            if char in " \t\r\n;&|<>" or (char in "()" and not (char == "(" and self._assignment_open(word))):
                break
            if char == "\\":
                self.take()
                nxt = self.take()
                if nxt != "\n":
                    word.segments.append(Segment("lit", nxt, True))
            elif char == "'":
                self.take()
                end = self.text.find("'", self.pos)
                end = len(self.text) if end < 0 else end
                word.segments.append(Segment("lit", self.text[self.pos:end], True))
                self.line += self.text.count("\n", self.pos, end)
                self.pos = end + 1
            elif char == '"':
                self.take()
                self._double_quoted(word)
            elif char == "$" or char == "`":
                word.segments.append(self._expansion(quoted=False))
            elif char == "(":  # NAME=( … ): an array
                self.take()
                word.array = self._array()
            else:
                word.segments.append(Segment("lit", self.take(), False))
        return word

    def _assignment_open(self, word: Word) -> bool:
        text = word.literal
        return text is not None and bool(_ASSIGNMENT.fullmatch(text))

    def _array(self) -> list[Word]:
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise ScriptTooComplex(self.line, f"arrays nested more than {MAX_DEPTH} deep")
        try:
            return self._elements()
        finally:
            self.depth -= 1

    def _elements(self) -> list[Word]:
        elements: list[Word] = []
        while self.pos < len(self.text):
            char = self.peek()
            if char in " \t\r\n":
                self.take()
            elif char == "\\" and self.peek(1) == "\n":
                self.take(), self.take()
            elif char == "#":
                while self.peek() not in ("", "\n"):
                    self.take()
            elif char == ")":
                self.take()
                break
            else:
                elements.append(self.word())
                if self.peek() in ";&|<>(":
                    self.take()  # not array syntax; skip the stray operator
        return elements

    def _double_quoted(self, word: Word) -> None:
        buffer = ""
        while self.pos < len(self.text):
            char = self.peek()
            if char == '"':
                self.take()
                break
            if char == "\\" and self.peek(1) in '$`"\\\n':
                self.take()
                nxt = self.take()
                buffer += "" if nxt == "\n" else nxt
            elif char in "$`":
                if buffer:
                    word.segments.append(Segment("lit", buffer, True))
                    buffer = ""
                word.segments.append(self._expansion(quoted=True))
            else:
                buffer += self.take()
        word.segments.append(Segment("lit", buffer, True))

    def _balanced(self, opening: str, closing: str) -> str:
        """The text up to the `closing` that balances an `opening` already taken; jumps from one
        character that matters to the next (a character-by-character loop made a few KiB of
        nested `${a:-${b:-…}}` take seconds)."""
        depth, start = 1, self.pos
        stops = re.compile("[\\\\\n" + re.escape(opening + closing) + "]")
        while (match := stops.search(self.text, self.pos)) is not None:
            char, self.pos = match.group(), match.end()
            if char == "\n":
                self.line += 1
            elif char == "\\":
                self.take()
            elif char == opening:
                depth += 1
                if depth > MAX_DEPTH:
                    raise ScriptTooComplex(self.line, f"'{opening}' nested more than {MAX_DEPTH} "
                                           "deep inside an expansion")
            else:
                depth -= 1
                if depth == 0:
                    return self.text[start:self.pos - 1]
        self.pos = len(self.text)
        return self.text[start:]

    def _expansion(self, quoted: bool) -> Segment:
        if self.take() == "`":
            end = self.text.find("`", self.pos)
            end = len(self.text) if end < 0 else end
            body = self.text[self.pos:end]
            self.pos = end + 1
            return Segment("cmd", body, quoted)
        if self.peek() == "(" and self.peek(1) == "(":
            self.take(), self.take()
            body = self._balanced("(", ")")
            if self.peek() == ")":
                self.take()
            return Segment("arith", body[:-1] if body.endswith(")") else body, quoted)
        if self.peek() == "(":
            self.take()
            return Segment("cmd", self._balanced("(", ")"), quoted)
        if self.peek() == "{":
            self.take()
            return Segment("var", self._balanced("{", "}"), quoted)
        name = _NAME.match(self.text, self.pos)
        if name:
            self.pos = name.end()
            return Segment("var", name.group(), quoted)
        if self.peek() and (self.peek().isdigit() or self.peek() in "@*#?$!-"):
            return Segment("var", self.take(), quoted)
        return Segment("lit", "$", quoted)


# ---------------------------------------------------------------------------------------- run
_PARAMETER = re.compile(r"(?P<length>#)?(?P<name>[A-Za-z_][A-Za-z0-9_]*|[0-9]+|[@*#?$!-])"
                        r"(?:\[(?P<index>[^\]]*)\])?(?P<op>:?[-=+?])?(?P<arg>.*)$", re.S)


class _Interpreter:
    def __init__(self, sets: dict[str, str]) -> None:
        self.sets = dict(sets)
        self.variables: dict[str, Value] = {}
        self.unresolved: dict[str, Unresolved] = {}  # of the words being expanded now
        self.carried: dict[str, dict[str, Unresolved]] = {}  # what a variable's value holds unresolved
        self.deciders: dict[str, Unresolved] = {}  # unknowns that left an `if` / `case` undecided
        self.assigned_somewhere: set[str] = set()  # every name an assignment anywhere in the script sets
        self.assumed_unset: set[str] = set()  # environment switches a test read as unset
        self.conflicts: set[str] = set()  # variables two undecided branches both assign
        self.frames: list[_Frame] = []
        self.line: int | str = 1  # of the statement being run (a key of an argument map)
        self.depth = 0  # defaults being expanded inside one another
        self.work = 0  # characters all expansions produced so far

    def spend(self, value: Value) -> Value:
        """Count an expanded value against the budgets; ScriptTooComplex past one."""
        if isinstance(value, list):
            if len(value) > MAX_ARRAY_ITEMS:
                raise ScriptTooComplex(self.line, f"an array grows past {MAX_ARRAY_ITEMS:,} elements")
            size = sum(map(len, value))
        else:
            size = len(value)
            if size > MAX_VALUE_CHARS:
                raise ScriptTooComplex(self.line, f"a value grows past {MAX_VALUE_CHARS:,} characters")
        self.work += size
        if self.work > MAX_WORK_CHARS:
            raise ScriptTooComplex(self.line, f"the expansions produce more than {MAX_WORK_CHARS:,} "
                                   "characters in all")
        return value

    # ------------------------------------------------------------------ values
    def lookup(self, name: str) -> Value | None:
        if name in self.sets:
            return self.sets[name]
        return self.variables.get(name)

    def _unknown(self, name: str, why: str) -> str:
        """Keep `${NAME}` in the word and note why its value is not known."""
        self.unresolved.setdefault(name, Unresolved(name, why))
        return "${" + name + "}"

    def parameter(self, body: str) -> Value:
        """`${body}`: plain, array, default, alternative; anything else is unresolved."""
        match = _PARAMETER.match(body)
        if match is None:
            return self._unknown(body, f"the expansion ${{{body}}} is not read statically")
        name, index, op, arg = match["name"], match["index"], match["op"], match["arg"] or ""
        if op is None and arg:
            return self._unknown(name, f"the expansion ${{{body}}} is not read statically")
        value = self.lookup(name)
        if isinstance(value, Unknown):
            return self._unknown(name, str(value))
        if name not in self.sets:
            for key, entry in self.carried.get(name, {}).items():
                self.unresolved.setdefault(key, entry)
        if value is not None and index is not None:
            if index in ("@", "*"):
                value = value if isinstance(value, list) else [value]
            elif isinstance(value, list):
                value = value[int(index)] if index.isdigit() and int(index) < len(value) else None
            elif index != "0":
                value = None
        elif isinstance(value, list):
            value = value[0] if value else ""
        if match["length"]:
            return str(len(value)) if value is not None else "0"
        empty = value is None or (op is not None and op.startswith(":") and value in ("", []))
        if op in (":-", "-", ":=", "="):
            if empty:
                default = self.expand_text(arg)
                if op.endswith("="):
                    self.variables[name] = default
                return default
            return value  # type: ignore[return-value]
        if op in (":+", "+"):
            return "" if empty else self.expand_text(arg)
        if value is None and name in self.assigned_somewhere:
            return ""  # the script sets it only in a branch that did not run: empty, as bash has it
        if value is None:
            if name.isdigit():
                return self._unknown(name, f"positional argument ${name} of the script")
            return self._unknown(name, NOT_SET)
        return value

    def expand_text(self, text: str) -> str:
        """A default's text (`${A:-"$B/x"}`): its words expanded without field splitting."""
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise ScriptTooComplex(self.line, f"defaults (${{A:-${{B:-…}}}}) nested more than "
                                   f"{MAX_DEPTH} deep")
        try:
            return self._expand_text(text)
        finally:
            self.depth -= 1

    def _expand_text(self, text: str) -> str:
        lexer = _Lexer(text, self.depth)  # arrays count against the same depth
        parts: list[str] = []
        while lexer.pos < len(text):
            if lexer.peek() in " \t\r\n":
                lexer.take()
                continue
            word = lexer.word()
            if not word.segments:
                lexer.take()
                continue
            parts.append("".join(self.fields(Word([Segment(s.kind, s.text, True) for s in word.segments]))))
        return self.spend(" ".join(parts))  # type: ignore[return-value]

    def arithmetic(self, body: str) -> str:
        """`$(( … ))` with the script's variables put in: + - * / % and comparisons, `c ? a : b`,
        in 64-bit integers as bash computes them; an expression longer than the budget stops the
        read, one this reader cannot compute stays unresolved."""
        if len(body) > MAX_ARITHMETIC_CHARS:
            raise ScriptTooComplex(self.line, f"an arithmetic expression of {len(body):,} characters "
                                   f"(more than {MAX_ARITHMETIC_CHARS:,})")
        names = set(re.findall(r"\$?\{?([A-Za-z_][A-Za-z0-9_]*)\}?", body))
        expression = body
        for name in sorted(names, key=len, reverse=True):
            value = self.lookup(name)
            if value is None or isinstance(value, Unknown | list):
                return self._unknown(name, f"used in $(({body.strip()})) but not set in the script"
                                     if value is None else f"used in $(({body.strip()}))")
            if len(value) > MAX_ARITHMETIC_CHARS:
                raise ScriptTooComplex(self.line, f"${name} in $(({body.strip()[:60]})) holds "
                                       f"{len(value):,} characters (more than {MAX_ARITHMETIC_CHARS:,})")
            expression = re.sub(rf"\$?\{{?\b{name}\b\}}?", f"({value})", expression)
            if len(expression) > MAX_ARITHMETIC_CHARS:
                raise ScriptTooComplex(self.line, f"$(({body.strip()[:60]})) grows past "
                                       f"{MAX_ARITHMETIC_CHARS:,} characters with its variables put in")
        expression = _python_ternary(expression.strip())
        try:
            return str(_integer(ast.parse(expression, mode="eval").body))
        except (SyntaxError, ValueError, ZeroDivisionError, RecursionError, MemoryError):
            return self._unknown(f"$(({body.strip()}))", "arithmetic that cannot be read statically")

    def segment(self, segment: Segment) -> Value:
        if segment.kind == "lit":
            return segment.text
        if segment.kind == "var":
            return self.parameter(segment.text)
        if segment.kind == "arith":
            return self.arithmetic(segment.text)
        return self._unknown(f"$({segment.text.strip()})", "a command's output, known only when the "
                             "script runs")

    def fields(self, word: Word) -> list[str]:
        """Bash's expansion of one word: unquoted expansions split on blanks, `"${A[@]}"` one field
        per element, a word of nothing but empty unquoted expansions vanishes."""
        out: list[str] = []
        current: str | None = None
        for segment in word.segments:
            value = self.segment(segment)
            if segment.kind == "lit":
                current = (current or "") + str(value)
                continue
            parts = value if isinstance(value, list) else None
            if segment.quoted:
                if parts is None:
                    current = (current or "") + str(value)
                    continue
                if not parts:
                    continue
                current = (current or "") + parts[0]
                for part in parts[1:]:
                    out.append(current)
                    current = part
                continue
            pieces = " ".join(parts) if parts is not None else str(value)
            split = pieces.split()
            if not split:
                continue
            if pieces[:1].isspace() and current is not None:
                out.append(current)
                current = None
            current = (current or "") + split[0]
            for part in split[1:]:
                out.append(current)
                current = part
            if pieces[-1:].isspace():
                out.append(current)
                current = None
        if current is not None:
            out.append(current)
        for part in out:
            self.spend(part)
        return out

    # ------------------------------------------------------------------ statements
    def assign(self, word: Word, local: dict[str, str] | None = None) -> bool:
        """`NAME=value`, `NAME+=value`, `NAME=( … )`, `NAME+=( … )`; False if not an assignment."""
        head = word.segments[0].text if word.segments and word.segments[0].kind == "lit" else ""
        prefix = ""
        for segment in word.segments:
            if segment.kind != "lit" or segment.quoted:
                break
            prefix += segment.text
            if "=" in prefix:
                break
        match = _ASSIGNMENT.match(prefix)
        if not head or match is None:
            return False
        name, appending = match.group(1), match.group(3) == "+="
        rest = _drop_prefix(word, len(match.group(0)))
        if word.array is not None:
            before = dict(self.unresolved)
            values = [f for element in word.array for f in self.fields(element)]
            found = {k: v for k, v in self.unresolved.items() if k not in before}
            self.unresolved = before
            self.carried[name] = {**(self.carried.get(name, {}) if appending else {}), **found}
            if appending:
                old = self.lookup(name)
                values = (old if isinstance(old, list) else [old] if old else []) + values
            self.variables[name] = self.spend(values)  # type: ignore[assignment]
            return True
        before = dict(self.unresolved)
        value = self._assigned(rest)
        found = {k: v for k, v in self.unresolved.items() if k not in before}
        self.unresolved = before
        if found and PLACEHOLDER.fullmatch(value) and not appending:
            # `CKPT=$1`: the variable is what the user sets, not what it was set from
            value = Unknown("set from " + ", ".join(_spelling(k) + f" ({v.why})" for k, v in found.items()))
        elif found:
            self.carried[name] = {**(self.carried.get(name, {}) if appending else {}), **found}
        if appending:
            old = self.lookup(name)
            value = self.spend((" ".join(old) if isinstance(old, list) else (old or "")) + value)  # type: ignore[assignment]
        for frame in self.frames:
            if frame.undecided and frame.assigned:
                frame.assigned[-1].add(name)
        if local is not None:
            local[name] = value
        else:
            self.sets.pop(name, None) if name not in self.sets else None
            if name not in self.sets:
                self.variables[name] = value
        return True

    def _assigned(self, word: Word) -> str:
        """An assignment's right side: no field splitting; a pure `$(…)` makes the value unknown;
        an array's elements (`cmd="torchrun ${ARGS[@]} x"`) joined by spaces, as bash joins them
        where no fields are made."""
        if len(word.segments) == 1 and word.segments[0].kind == "cmd":
            return Unknown(f"set from the output of $({word.segments[0].text.strip()})")
        quoted = Word([Segment(s.kind, s.text, True) for s in word.segments])
        return " ".join(self.fields(quoted))

    def run(self, statements: list[tuple[int, list[Word], str]]) -> tuple[list[Command], list[str]]:
        """Statements in order; `if`/`elif`/`else` and `case` take the branch their test selects,
        and run every branch when the test cannot be decided (then `deciders` names why)."""
        commands: list[Command] = []
        included: list[str] = []
        frames = self.frames
        index = 0
        while index < len(statements):
            line, words, end = statements[index]
            self.line = line
            index += 1
            words = list(words)
            head = words[0].literal if words else None
            frame = frames[-1] if frames else None
            if frame is not None and frame.kind == "case" and frame.expecting:
                if head == "esac":
                    self.conflicts |= frames.pop().conflicts()
                    continue
                frame.patterns += [" ".join(self.fields(w)) for w in words]
                if end == ")":
                    frame.expecting = False
                    self._open_case_branch(frame)
                continue
            if head in ("if", "elif", "while", "until"):
                condition = [words[1:]]
                joins = [end]
                while joins[-1] in ("&&", "||") and index < len(statements):
                    condition.append(list(statements[index][1]))
                    joins.append(statements[index][2])
                    index += 1
                decided = self.condition(condition, joins[:-1])
                if head == "elif" and frame is not None:
                    frame.branch(decided)
                elif head == "if":
                    frames.append(_Frame("if", parent=self._running(frames)))
                    frames[-1].branch(decided)
                else:
                    frames.append(_Frame("loop", parent=self._running(frames)))
                continue
            if head == "else" and frame is not None:
                frame.otherwise()
                words = words[1:]
            elif head in ("fi", "done", "esac") and frames:
                self.conflicts |= frames.pop().conflicts()
                continue
            elif head == "case":
                value = " ".join(self.fields(words[1])) if len(words) > 1 else ""
                frames.append(_Frame("case", parent=self._running(frames), value=value, expecting=True))
                continue
            elif head in ("for", "select"):
                frames.append(_Frame("loop", parent=self._running(frames)))
                continue
            while words and words[0].literal in _KEYWORDS:
                words.pop(0)
            if end == ";;" and frames and frames[-1].kind == "case":
                frames[-1].expecting = True
                frames[-1].patterns = []
            if not words or not self._running(frames):
                continue
            command = self.statement(words, line, included)
            if command is not None:
                commands.append(command)
        return commands, included

    def _running(self, frames: list[_Frame]) -> bool:
        return all(f.taking for f in frames) and all(f.parent for f in frames)

    def _open_case_branch(self, frame: _Frame) -> None:
        matched = any(fnmatch.fnmatchcase(frame.value, p) for p in frame.patterns)
        known = PLACEHOLDER.search(frame.value) is None
        frame.branch(matched if known else None)

    def condition(self, tests: list[list[Word]], joins: list[str]) -> bool | None:
        """`[ … ]` / `[[ … ]]` / `test` joined by && and ||: True, False, or None (not decidable)."""
        results = [self.test(words) for words in tests]
        value = results[0]
        for join, result in zip(joins, results[1:], strict=False):
            decisive = False if join == "&&" else True  # what settles `a && b` / `a || b` alone
            if decisive in (value, result):
                value = decisive
            else:
                value = None if None in (value, result) else not decisive
        return value

    def test(self, words: list[Word]) -> bool | None:
        before = dict(self.unresolved)
        fields = [" ".join(self.fields(w)) if w.segments else "" for w in words]
        unknown = {k: v for k, v in self.unresolved.items() if k not in before}
        self.unresolved = before
        if fields and fields[0] in ("[", "[[", "test"):
            fields = fields[1:]
        if fields and fields[-1] in ("]", "]]"):
            fields = fields[:-1]
        negate = bool(fields) and fields[0] == "!"
        fields = fields[1:] if negate else fields
        unset = [k for k, v in unknown.items() if v.why == NOT_SET]
        if unknown and len(unset) == len(unknown):
            # an environment switch the script tests (`[ -z ${MP_VP} ]`): unset reads as empty, as in bash
            self.assumed_unset.update(unset)
            saved = {name: self.sets.get(name) for name in unset}
            self.sets.update({name: "" for name in unset})
            fields = [" ".join(self.fields(w)) if w.segments else "" for w in words]
            for name, value in saved.items():
                self.sets.pop(name) if value is None else self.sets.__setitem__(name, value)
            self.unresolved = before
            fields = fields[1:] if fields and fields[0] in ("[", "[[", "test") else fields
            fields = fields[:-1] if fields and fields[-1] in ("]", "]]") else fields
            fields = fields[1:] if negate else fields
        elif unknown:
            self.deciders.update(unknown)
            return None
        result = _evaluate_test(fields)
        return None if result is None else result != negate

    def statement(self, words: list[Word], line: int, included: list[str]) -> Command | None:
        head = words[0].literal
        if head in ("function", "[", "[[", "test", "exit", "return") or (head or "").endswith(("()", ")")):
            return None
        if head in _DECLARE:
            for word in words[1:]:
                if not (word.literal or "").startswith("-"):
                    self.assign(word)
            return None
        if head in ("source", "."):
            included += [" ".join(self.fields(w)) for w in words[1:2]]
            return None
        if head == "unset":
            for word in words[1:]:
                self.variables.pop(word.literal or "", None)
            return None
        assignments = 0
        while assignments < len(words) and self._is_assignment(words[assignments]):
            assignments += 1
        if assignments == len(words):
            for word in words:
                self.assign(word)
            return None
        env: dict[str, str] = {}
        for word in words[:assignments]:
            self.assign(word, env)
        self.unresolved = {}
        expanded = [f for word in words[assignments:] for f in self.fields(word)]
        if expanded and expanded[0] == "eval":
            try:
                expanded = shell_words(" ".join(expanded[1:]))
            except ValueError:
                expanded = " ".join(expanded[1:]).split()
        command = Command(expanded, env, line, self.unresolved)
        self.unresolved = {}
        return command

    def _is_assignment(self, word: Word) -> bool:
        return bool(_ASSIGNMENT.match(_literal_prefix(word)))


@dataclass
class _Frame:
    """One open `if`, `case` or loop: whether its current branch runs."""

    kind: str
    parent: bool = True  # whether the enclosing code runs
    value: str = ""  # the case word
    expecting: bool = False  # a case waiting for its next pattern list
    patterns: list[str] = field(default_factory=list)
    taking: bool = True
    done: bool = False  # a branch was taken
    undecided: bool = False
    assigned: list[set[str]] = field(default_factory=list)  # names each undecided branch sets

    def conflicts(self) -> set[str]:
        """Names that more than one undecided branch sets: the static read cannot pick a value."""
        seen: set[str] = set()
        twice: set[str] = set()
        for names in self.assigned:
            twice |= seen & names
            seen |= names
        return twice

    def branch(self, decided: bool | None) -> None:
        """The next branch: taken when its test holds and no earlier branch was."""
        self.assigned.append(set())
        if self.done:
            self.taking = False
        elif decided is None:
            self.taking, self.undecided = True, True
        else:
            self.taking, self.done = decided, decided
            self.undecided = False

    def otherwise(self) -> None:
        self.assigned.append(set())
        self.taking = not self.done or self.undecided
        if self.undecided:
            self.done = False


_INTEGER_TESTS = {"-eq": lambda a, b: a == b, "-ne": lambda a, b: a != b, "-gt": lambda a, b: a > b,
                  "-ge": lambda a, b: a >= b, "-lt": lambda a, b: a < b, "-le": lambda a, b: a <= b}


def _evaluate_test(fields: list[str]) -> bool | None:
    """The few test forms launch scripts use: -z/-n, string = == != and the integer comparisons."""
    if len(fields) == 2 and fields[0] in ("-z", "-n"):
        return (fields[1] == "") == (fields[0] == "-z")
    if len(fields) == 1:
        return fields[0] != ""
    if not fields:
        return False
    if len(fields) == 3:
        left, op, right = fields
        if op in ("=", "=="):
            return fnmatch.fnmatchcase(left, right) if "*" in right else left == right
        if op == "!=":
            return left != right
        if op in _INTEGER_TESTS:
            try:
                return _INTEGER_TESTS[op](int(left), int(right))
            except ValueError:
                return None
    return None


def _literal_prefix(word: Word) -> str:
    """The unquoted literal text a word starts with (where `NAME=` of an assignment is)."""
    prefix = ""
    for segment in word.segments:
        if segment.kind != "lit" or segment.quoted:
            break
        prefix += segment.text
    return prefix


def _spelling(name: str) -> str:
    return name if name.startswith("$") else "$" + name


def _drop_prefix(word: Word, length: int) -> Word:
    """The word minus its first `length` literal characters (the `NAME=` of an assignment)."""
    segments: list[Segment] = []
    left = length
    for segment in word.segments:
        if left > 0 and segment.kind == "lit":
            cut = min(left, len(segment.text))
            left -= cut
            if cut < len(segment.text):
                segments.append(Segment("lit", segment.text[cut:], segment.quoted))
            continue
        segments.append(segment)
    return Word(segments)


def _python_ternary(expression: str) -> str:
    """bash's `c ? a : b` (right-associative: `c ? a : d ? b : e`) in Python's spelling, at the
    top level of the expression. Found by scanning, in linear time per level (a pattern with two
    greedy groups backtracked for minutes over a long expression)."""
    depth, ask, pending = 0, -1, 0
    for at, char in enumerate(expression):
        if char in "()":
            depth += 1 if char == "(" else -1
        elif depth == 0 and char == "?":
            ask = at if ask < 0 else ask
            pending += 1
        elif depth == 0 and char == ":" and ask >= 0:
            pending -= 1
            if pending == 0:
                return (f"(({_python_ternary(expression[ask + 1:at])}) if ({expression[:ask]}) "
                        f"else ({_python_ternary(expression[at + 1:])}))")
    return expression


def _wrapped(value: int) -> int:
    """The value as bash's 64-bit arithmetic holds it (two's complement wrap-around)."""
    value &= (1 << INT_BITS) - 1
    return value - (1 << INT_BITS) if value >> (INT_BITS - 1) else value


def _integer(node: ast.AST) -> int:
    if isinstance(node, ast.Constant) and type(node.value) is int:
        if node.value.bit_length() > INT_BITS:
            raise ValueError("a number beyond 64 bits")
        return _wrapped(node.value)
    if isinstance(node, ast.IfExp):
        return _integer(node.body) if _integer(node.test) else _integer(node.orelse)
    if isinstance(node, ast.Compare) and len(node.ops) == 1:
        left, right = _integer(node.left), _integer(node.comparators[0])
        compare = {ast.Gt: left > right, ast.GtE: left >= right, ast.Lt: left < right,
                   ast.LtE: left <= right, ast.Eq: left == right, ast.NotEq: left != right}
        if type(node.ops[0]) in compare:
            return int(compare[type(node.ops[0])])
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
        value = _integer(node.operand)
        return _wrapped(-value) if isinstance(node.op, ast.USub) else value
    if isinstance(node, ast.BinOp):
        left, right = _integer(node.left), _integer(node.right)
        if isinstance(node.op, ast.Add):
            return _wrapped(left + right)
        if isinstance(node.op, ast.Sub):
            return _wrapped(left - right)
        if isinstance(node.op, ast.Mult):
            return _wrapped(left * right)
        if isinstance(node.op, ast.Div | ast.FloorDiv):
            if right == 0:
                raise ZeroDivisionError
            quotient = abs(left) // abs(right)  # bash truncates toward zero
            return _wrapped(quotient if (left < 0) == (right < 0) else -quotient)
        if isinstance(node.op, ast.Mod):
            if right == 0:
                raise ZeroDivisionError
            rest = abs(left) % abs(right)  # bash's remainder takes the dividend's sign
            return rest if left >= 0 else -rest
    raise ValueError("not integer arithmetic")


_SBATCH = re.compile(r"^[ \t]*#SBATCH[ \t]+(.*)$", re.M)  # [ \t]: `\s*` would span lines (quadratic)
_SBATCH_SHORT = {"-N": "nodes", "-n": "ntasks", "-G": "gpus"}


def sbatch_options(text: str) -> dict[str, str]:
    """`#SBATCH` directives by long option name (`-N 4` → nodes)."""
    options: dict[str, str] = {}
    for match in _SBATCH.finditer(text):
        try:
            words = shell_words(match.group(1))
        except ValueError:
            continue
        for i, word in enumerate(words):
            if word.startswith("--"):
                name, eq, value = word[2:].partition("=")
                options[name] = value if eq else (words[i + 1] if i + 1 < len(words) else "")
            elif word in _SBATCH_SHORT and i + 1 < len(words):
                options[_SBATCH_SHORT[word]] = words[i + 1]
    return options


def read_script(text: str, sets: dict[str, str] | None = None) -> ShellRead:
    """Run the script's assignments and expand every command, without executing anything."""
    interpreter = _Interpreter(sets or {})
    statements = _Lexer(text).statements()
    interpreter.assigned_somewhere = {match.group(1) for _, words, _ in statements for word in words
                                      if (match := _ASSIGNMENT.match(_literal_prefix(word)))}
    commands, included = interpreter.run(statements)
    return ShellRead(commands, interpreter.variables, sbatch_options(text), included, interpreter.deciders,
                     sorted(interpreter.conflicts), sorted(interpreter.assumed_unset), interpreter.carried)


def entry_index(words: list[str]) -> int | None:
    """Where the Python entry script (`pretrain_gpt.py`) is in a command's words."""
    return next((i for i, w in enumerate(words) if w.endswith(ENTRY_SUFFIX) and not w.startswith("-")), None)


def launch_command(read: ShellRead) -> Command | None:
    """The command that starts Megatron: the one with a `*.py` entry and the most `--` arguments
    after it (ties: the last, as a script usually ends with the launch)."""
    best: tuple[int, int] | None = None
    chosen: Command | None = None
    for order, command in enumerate(read.commands):
        at = entry_index(command.words)
        if at is None:
            continue
        score = (sum(w.startswith("--") for w in command.words[at + 1:]), order)
        if best is None or score >= best:
            best, chosen = score, command
    return chosen


PLACEHOLDER = re.compile(r"\$\{([^}]*)\}")
_MIN_FLAGS = 3  # a variable holding fewer `--flags` is not an argument list


def argument_variables(read: ShellRead) -> tuple[list[str], list[str], dict[str, Unresolved]] | None:
    """A snippet that only defines argument lists (`MODEL_ARGS="--num-layers 48 …"`, no launch):
    the variables whose words are Megatron flags, in the order the script sets them, their words,
    and what they hold unresolved."""
    names: list[str] = []
    argv: list[str] = []
    unresolved: dict[str, Unresolved] = {}
    for name, value in read.variables.items():
        words = value if isinstance(value, list) else [] if isinstance(value, Unknown) else value.split()
        if words and words[0].startswith("--") and sum(w.startswith("--") for w in words) >= _MIN_FLAGS:
            names.append(name)
            argv += words
            unresolved.update(read.carried.get(name, {}))
    return (names, argv, unresolved) if names else None


def expand_value(text: str, variables: dict[str, str],
                 where: str = "a value") -> tuple[str, dict[str, Unresolved]]:
    """`${VAR}` and `$VAR` in one value (envsubst's job in the YAML harnesses), unknowns kept as
    `${VAR}` and listed; ScriptTooComplex (naming `where`) past a budget."""
    if "$" not in text and "`" not in text:
        return text, {}
    interpreter = _Interpreter(variables)
    interpreter.line = where
    value = interpreter.expand_text(text)
    return value, interpreter.unresolved
