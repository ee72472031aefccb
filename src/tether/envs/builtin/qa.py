"""Multi-hop question answering with a BM25 search tool (HotpotQA-like; Yang et al., arXiv 1809.09600 §2).

A bundled synthetic corpus — generated from a fixed seed, no downloads — describes a small
world: people (born in a city, working for a company), cities (in a country) and companies
(based in a city), one short titled passage each:

    Ann Lee: born in Seville, works for Zentra.
    Seville: a city in Spain.
    Zentra: a company based in Lyon.

Questions need two hops (a bridge entity found in the first passage): "Which country was Ann
Lee born in?" -> search("Ann Lee") -> Seville -> search("Seville") -> Spain. With `hops: 3`,
"Which country is the employer of Ann Lee based in?" adds company -> city -> country. The
`search` tool ranks the passages with BM25 (the `bm25s` library; Robertson & Zaragoza 2009)
and returns the top `top_k`. The episode ends with a reply without tool calls, `Answer: Spain`;
reward 1 when it names the answer (case and punctuation ignored), else 0; `info["correct"]`.

The scripted expert searches each hop's entity, then answers. Its mistakes (`sft.demo_noise`):
the final answer names an entity it read on the way — a bridge entity (the classic multi-hop
slip) or the first passage's other fact (the birth city when the employer was asked about).

Task kwargs: `hops` (2 or [2, 3]), `top_k` (1), `world_seed` (0), `people` (400).
"""

from __future__ import annotations

import random
import re
import threading
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Mapping, Sequence

from tether.envs.base import Action, EnvSpec, Observation, StepResult, register_env
from tether.envs.tools import Tool, make_tool, run_tool_turn
from tether.types import Message

SYSTEM = "Search to find facts. End with: Answer: <name>"
FIRST = ("Ann", "Bob", "Cal", "Dee", "Eva", "Fin", "Gus", "Hal", "Ida", "Jon", "Kim", "Lou", "Max", "Ned", "Oda",
         "Pam", "Quin", "Rex", "Sid", "Tia", "Uma", "Vic", "Wes", "Zoe")
LAST = ("Lee", "Moss", "Park", "Reed", "Shaw", "Tate", "Vale", "Webb", "Hart", "Cole", "Dunn", "Ford", "Gray",
        "Hale", "Kerr", "Lane", "Nash", "Pope", "Rios", "Sato", "Wolfe", "York", "Ames", "Bell")
COUNTRIES = ("Spain", "France", "Chile", "Japan", "Kenya", "Peru", "Norway", "Egypt")
CITIES = ("Bilbao", "Seville", "Lyon", "Nice", "Osorno", "Talca", "Kyoto", "Osaka", "Nakuru", "Mombasa", "Cusco",
          "Lima", "Bergen", "Oslo", "Giza", "Luxor")
COMPANIES = ("Zentra", "Voltik", "Marlo", "Quadex", "Brivo", "Kelsa", "Norta", "Plexa", "Dorin", "Velta", "Omnix",
             "Tarvo")
QUESTIONS = {
    "born_country": "Which country was {p} born in?",
    "employer_city": "Which city is the employer of {p} based in?",
    "employer_country": "Which country is the employer of {p} based in?",
}
HOPS = {"born_country": 2, "employer_city": 2, "employer_country": 3}
_BM25_LOCK = threading.Lock()


@dataclass(frozen=True)
class World:
    """The corpus: passages (title, text) and the facts behind them."""

    passages: tuple[tuple[str, str], ...]
    born: Mapping[str, str]  # person -> city
    works: Mapping[str, str]  # person -> company
    city_country: Mapping[str, str]
    company_city: Mapping[str, str]


@lru_cache(maxsize=4)
def build_world(world_seed: int = 0, people: int = 400) -> World:
    """The synthetic corpus for `world_seed` (deterministic; countries have two cities each)."""
    rng = random.Random(world_seed)
    city_country = {c: COUNTRIES[i // 2] for i, c in enumerate(CITIES)}
    company_city = {c: rng.choice(CITIES) for c in COMPANIES}
    names = [f"{f} {s}" for f in FIRST for s in LAST]
    rng.shuffle(names)
    names = sorted(names[:people])
    born = {p: rng.choice(CITIES) for p in names}
    works = {p: rng.choice(COMPANIES) for p in names}
    passages = [(p, f"born in {born[p]}, works for {works[p]}.") for p in names]
    passages += [(c, f"a city in {k}.") for c, k in city_country.items()]
    passages += [(c, f"a company based in {k}.") for c, k in company_city.items()]
    return World(tuple(passages), born, works, city_country, company_city)


def _words(text: str) -> list[str]:
    return re.findall(r"[a-z0-9]+", text.lower())


@lru_cache(maxsize=4)
def _index(world_seed: int, people: int):
    import bm25s

    world = build_world(world_seed, people)
    docs = [f"{t} {t} {x}" for t, x in world.passages]  # the title counts twice, as a title field would
    retriever = bm25s.BM25()
    retriever.index(bm25s.tokenize(docs, stopwords="en", show_progress=False), show_progress=False)
    return retriever


def run_search(query: str, world_seed: int = 0, people: int = 400, top_k: int = 1) -> list[str]:
    """The top-k passages for `query` as 'Title: text' lines (BM25, English stop words removed)."""
    return list(_search(query, world_seed, people, top_k))


@lru_cache(maxsize=16384)
def _search(query: str, world_seed: int, people: int, top_k: int) -> tuple[str, ...]:
    """run_search, remembered: the corpus is fixed, and the episodes of a group mostly search the same
    entities (the demo: most of a step's searches repeat an earlier one)."""
    import bm25s

    world = build_world(world_seed, people)
    tokens = bm25s.tokenize([query], stopwords="en", show_progress=False)
    if not any(len(t) for t in tokens.ids):
        return ()
    with _BM25_LOCK:
        docs, scores = _index(world_seed, people).retrieve(tokens, k=min(top_k, len(world.passages)),
                                                          show_progress=False, n_threads=1)
    return tuple(f"{world.passages[d][0]}: {world.passages[d][1]}" for d, s in zip(docs[0], scores[0]) if s > 0)


def make_qa_task(rng: random.Random, i: int, kw: dict[str, Any]) -> dict[str, Any]:
    """One question: the person, its hop chain (the expert's queries) and the answer."""
    seed, people = int(kw.get("world_seed", 0)), int(kw.get("people", 400))
    world = build_world(seed, people)
    hops = kw.get("hops", 2)
    allowed = {int(h) for h in (hops if isinstance(hops, (list, tuple)) else [hops])}
    kinds = [k for k in QUESTIONS if HOPS[k] in allowed]
    if not kinds:
        raise ValueError(f"qa: hops={hops!r}; valid: 2, 3 or a list of them")
    kind = rng.choice(kinds)
    person = rng.choice(sorted(world.born))
    if kind == "born_country":
        chain = [person, world.born[person], world.city_country[world.born[person]]]
    else:
        company = world.works[person]
        city = world.company_city[company]
        chain = [person, company, city] + ([world.city_country[city]] if kind == "employer_country" else [])
    # the wrong answers a careless reader of the same passages gives: a bridge, or the first passage's other fact
    distractors = sorted({*chain[1:-1], world.born[person], world.works[person]} - {chain[-1]})
    return {"id": f"qa-{i}", "prompt": QUESTIONS[kind].format(p=person), "answer": chain[-1], "queries": chain[:-1],
            "kind": kind, "distractors": distractors, "world_seed": seed, "people": people,
            "top_k": int(kw.get("top_k", 1))}


def normalize(text: str) -> str:
    return " ".join(_words(text))


def parse_answer(text: str) -> str | None:
    """The text after the last `Answer:` (else the whole reply), normalised."""
    m = re.findall(r"Answer:\s*([^\n]*)", text)
    got = normalize(m[-1] if m else text)
    return got or None


class QAEnv:
    """One episode of a question (single use): search any number of times, then answer."""

    def __init__(self, task: Mapping[str, Any], tool_timeout_s: float = 5.0) -> None:
        self.task = task
        seed, people, k = int(task["world_seed"]), int(task["people"]), int(task["top_k"])

        def search(query: str) -> str:
            """Search the corpus.

            Args:
                query: a name
            """
            return "\n".join(run_search(query, seed, people, k)) or "no results"

        self.tools: tuple[Tool, ...] = (make_tool(search, timeout_s=tool_timeout_s),)

    def reset(self) -> Observation:
        return Observation((Message("system", SYSTEM), Message("user", self.task["prompt"])))

    def step(self, action: Action) -> StepResult:
        parsed = action.parsed
        if parsed.calls or parsed.errors:
            messages, info = run_tool_turn(self.tools, parsed)
            return StepResult(Observation(tuple(messages)), 0.0, False, {**info, "correct": False})
        got = parse_answer(action.text)
        correct = got is not None and got == normalize(self.task["answer"])
        return StepResult(Observation(()), 1.0 if correct else 0.0, True, {"correct": correct, "answer": got})


def summarize_qa_facts(messages: Sequence[Message]) -> str:
    """The facts the dropped turns found (env.context.summarizer for Agent-R1's `summary` rule,
    arXiv 2511.14460): every passage a search returned, once, in order, without the queries, e.g.
    `found: Ann Lee: born in Seville, works for Zentra. | Seville: a city in Spain.`"""
    seen: list[str] = []
    for m in messages:
        if m.role != "tool":
            continue
        for line in m.content.splitlines():
            line = line.strip()
            if line and line != "no results" and ":" in line and line not in seen:
                seen.append(line)
    return "found: " + " | ".join(seen) if seen else "found: nothing yet"


def search_call(query: str) -> str:
    return '<tool_call>{"name": "search", "arguments": {"query": "%s"}}</tool_call>' % query


def qa_expert(task: Mapping[str, Any], history: Sequence[Message]) -> str:
    """Search each hop's entity in turn, then answer."""
    done = sum(m.role == "tool" for m in history)
    if done < len(task["queries"]):
        return search_call(task["queries"][done])
    return f"Answer: {task['answer']}"


def qa_mistake(task: Mapping[str, Any], history: Sequence[Message], action: str, rng: random.Random) -> str | None:
    """A wrong final answer taken from the passages read: a bridge entity or the first passage's other fact."""
    if not action.startswith("Answer:"):
        return None
    return f"Answer: {rng.choice(task['distractors'])}"


@register_env("qa")
def qa_env() -> EnvSpec:
    return EnvSpec("qa", make_qa_task, QAEnv, qa_expert, "HotpotQA-like multi-hop QA with a BM25 search tool",
                   qa_mistake)
