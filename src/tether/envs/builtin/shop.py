"""A web shop: search, open a product, choose its options, buy (WebShop-like; Yao et al., arXiv 2207.01206 §3).

A generated catalog (fixed seed, no downloads) of products "<material> <type>" with a price and
the colors and sizes each one comes in. An instruction names what to buy:

    Buy a wool scarf, color red, size M, under $40.

Actions are WebShop-style text commands, one per turn:

    search[<words>]        the top 3 products by BM25 over titles: "p13 wool scarf $32" lines
    open[<id>]             the product page: price, colors, sizes
    buy[<color>, <size>]   buys the open product with those options; ends the episode

Reward = attribute match, as WebShop scores a purchase: the mean of five checks — type,
material, color, size, price within budget — so a near miss still earns a graded signal;
`info["correct"]` (success) only when all five hold. The scripted expert searches the material
and type, opens the matching product, buys the requested options (3 turns). Its mistakes
(`sft.demo_noise`): opening the next search result instead, or buying another color.

Task kwargs: `catalog_seed` (0).
"""

from __future__ import annotations

import random
import re
import threading
from functools import lru_cache
from typing import Any, Mapping, Sequence

from tether.envs.base import Action, EnvSpec, Observation, StepResult, register_env
from tether.types import Message

SYSTEM = "Actions: search[words], open[id], buy[color, size]"
TYPES = ("shirt", "scarf", "hat", "bag", "shoes", "mug", "lamp", "jacket", "sock", "belt", "coat", "glove")
MATERIALS = ("wool", "cotton", "leather", "silk", "linen", "denim", "bamboo", "canvas", "nylon", "velvet")
COLORS = ("red", "blue", "black", "white", "green", "gray", "pink", "brown")
SIZES = ("XS", "S", "M", "L", "XL")
TOP_K = 3
_LOCK = threading.Lock()


@lru_cache(maxsize=4)
def build_catalog(catalog_seed: int = 0) -> tuple[dict[str, Any], ...]:
    """Every material x type once: id, title, price, colors (3), sizes (2-3)."""
    rng = random.Random(catalog_seed)
    combos = [(m, t) for t in TYPES for m in MATERIALS]
    rng.shuffle(combos)
    return tuple({"id": f"p{i + 1}", "material": m, "type": t, "title": f"{m} {t}", "price": rng.randint(5, 95),
                  "colors": tuple(rng.sample(COLORS, 3)), "sizes": tuple(sorted(rng.sample(SIZES, rng.randint(2, 3)),
                                                                                   key=SIZES.index))}
                 for i, (m, t) in enumerate(combos))


@lru_cache(maxsize=4)
def _index(catalog_seed: int):
    import bm25s

    retriever = bm25s.BM25()
    titles = [p["title"] for p in build_catalog(catalog_seed)]
    retriever.index(bm25s.tokenize(titles, stopwords="en", show_progress=False), show_progress=False)
    return retriever


def run_search(query: str, catalog_seed: int = 0, k: int = TOP_K) -> list[dict[str, Any]]:
    """The top-k products whose titles match `query` (BM25; ties broken by catalog order)."""
    catalog = build_catalog(catalog_seed)
    return [catalog[d] for d in _ranked(query, catalog_seed)[:k]]


@lru_cache(maxsize=16384)
def _ranked(query: str, catalog_seed: int) -> tuple[int, ...]:
    """The catalog indices matching `query`, best first (remembered: the catalog is fixed)."""
    import bm25s

    catalog = build_catalog(catalog_seed)
    tokens = bm25s.tokenize([query], stopwords="en", show_progress=False)
    if not any(len(t) for t in tokens.ids):
        return ()
    with _LOCK:
        docs, scores = _index(catalog_seed).retrieve(tokens, k=len(catalog), show_progress=False, n_threads=1)
    return tuple(d for _, d in sorted((-float(s), int(d)) for d, s in zip(docs[0], scores[0]) if s > 0))


def make_shop_task(rng: random.Random, i: int, kw: dict[str, Any]) -> dict[str, Any]:
    """An instruction for one catalog product with options it comes in and a budget above its price."""
    seed = int(kw.get("catalog_seed", 0))
    p = rng.choice(build_catalog(seed))
    color, size = rng.choice(p["colors"]), rng.choice(p["sizes"])
    budget = (p["price"] // 10 + rng.randint(1, 3)) * 10
    prompt = f"Buy a {p['title']}, color {color}, size {size}, under ${budget}."
    return {"id": f"shop-{i}", "prompt": prompt, "product": p["id"], "material": p["material"], "type": p["type"],
            "color": color, "size": size, "budget": budget, "catalog_seed": seed, "answer": f"{p['id']} {color} {size}"}


def compute_match(task: Mapping[str, Any], product: Mapping[str, Any], color: str, size: str) -> dict[str, bool]:
    """The five WebShop-style checks of a purchase."""
    return {"type": product["type"] == task["type"], "material": product["material"] == task["material"],
            "color": color == task["color"] and color in product["colors"],
            "size": size == task["size"] and size in product["sizes"],
            "price": product["price"] <= task["budget"]}


def _page(p: Mapping[str, Any]) -> str:
    return f"{p['id']} {p['title']} ${p['price']}. colors: {', '.join(p['colors'])}. sizes: {', '.join(p['sizes'])}."


class ShopEnv:
    """One shopping episode (single use): search and open pages until a buy."""

    tools: tuple = ()

    def __init__(self, task: Mapping[str, Any]) -> None:
        self.task = task
        self.catalog = {p["id"]: p for p in build_catalog(int(task["catalog_seed"]))}
        self.page: Mapping[str, Any] | None = None

    def reset(self) -> Observation:
        return Observation((Message("system", SYSTEM), Message("user", self.task["prompt"])))

    def _reply(self, text: str) -> StepResult:
        return StepResult(Observation((Message("user", text),)), 0.0, False, {"correct": False})

    def step(self, action: Action) -> StepResult:
        m = re.match(r"\s*(search|open|buy)\[([^\]]*)\]", action.text)
        if m is None:
            return self._reply("Unknown action. Use search[...], open[...] or buy[...].")
        verb, arg = m.group(1), m.group(2).strip()
        if verb == "search":
            hits = run_search(arg, int(self.task["catalog_seed"]))
            return self._reply("\n".join(f"{p['id']} {p['title']} ${p['price']}" for p in hits) or "No results.")
        if verb == "open":
            self.page = self.catalog.get(arg)
            return self._reply(_page(self.page) if self.page else f"No product {arg}.")
        if self.page is None:
            return self._reply("Open a product first.")
        options = [x.strip() for x in arg.split(",")]
        color, size = (options + ["", ""])[:2]
        checks = compute_match(self.task, self.page, color, size.upper())
        reward = sum(checks.values()) / len(checks)
        info = {"correct": all(checks.values()), "bought": self.page["id"], **{f"match_{k}": int(v) for k, v in checks.items()}}
        return StepResult(Observation((Message("user", f"Bought {self.page['id']}."),)), reward, True, info)


def _actions(history: Sequence[Message]) -> list[str]:
    return [m.content for m in history if m.role == "assistant"]


def shop_expert(task: Mapping[str, Any], history: Sequence[Message]) -> str:
    """search[material type] -> open[the matching product] -> buy[color, size]."""
    done = len(_actions(history))
    if done == 0:
        return f"search[{task['material']} {task['type']}]"
    if done == 1:
        return f"open[{task['product']}]"
    return f"buy[{task['color']}, {task['size']}]"


def shop_mistake(task: Mapping[str, Any], history: Sequence[Message], action: str, rng: random.Random) -> str | None:
    """Open the next search result instead of the match (half the time), or buy another color."""
    if action.startswith("open[") and rng.random() < 0.5:
        hits = run_search(f"{task['material']} {task['type']}", int(task["catalog_seed"]))
        others = [p["id"] for p in hits if p["id"] != task["product"]]
        return f"open[{others[0]}]" if others else None
    if action.startswith("buy["):
        page = next(p for p in build_catalog(int(task["catalog_seed"])) if p["id"] == task["product"])
        return f"buy[{rng.choice([c for c in page['colors'] if c != task['color']])}, {task['size']}]"
    return None


@register_env("shop")
def shop_env() -> EnvSpec:
    return EnvSpec("shop", make_shop_task, ShopEnv, shop_expert, "WebShop-like shopping: search, open, buy with options",
                   shop_mistake)
