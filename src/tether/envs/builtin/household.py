"""A text household world: go to, open, take, put, goal check (ALFWorld-like; Shridhar et al., arXiv 2010.03768 §3).

One room with four receptacles — open ones (table, shelf, counter, desk) hold objects, closed
ones (drawer, cabinet, fridge, box) must be opened before anything goes in — and a goal such as
"put the apple in the fridge". Actions are ALFWorld-style text commands, one per turn:

    go to <receptacle> | open <receptacle> | take <object> | put <object> in/on <receptacle>

The first observation lists the receptacles (closed ones marked) and says where the goal
object lies — a simplification of ALFWorld, where finding it is part of the task, that keeps
episodes at four or five commands for a tiny model; arriving somewhere shows what lies there.
Each command answers with a short observation ("Nothing happens." when it does not apply, as
in ALFWorld).
Putting the goal object down ends the episode: reward 1 and `info["correct"]` when it went
into the goal receptacle (the goal check), else 0. Five commands solve every task.

The scripted expert replays its commands on the world to know where it is: go to the object,
take it, go to the goal, open it if closed, put the object there. Its mistake
(`sft.demo_noise`): going to a wrong receptacle after taking the object, then finishing the
plan there — the object ends in the wrong place.

Task kwargs: `receptacles` (4), `objects` (3), `subgoal_reward` (0: outcome only).

Step rewards (AgentPRM-style dense credit, issue 19): with `subgoal_reward = s > 0` the world also
pays `s` the first time each subgoal of the plan is reached — the goal object picked up, the goal
receptacle reached while carrying it, the goal receptacle opened when it was closed — so an
episode's return is (number of subgoals reached) x s + (1 if the object went in the right place).
The verified outcome (`info["correct"]`) is unchanged. With `env.credit=step`, each reward stays on
the turn that earned it (GiGPO, REINFORCE++, GAE see when it arrived).
"""

from __future__ import annotations

import random
import re
from typing import Any, Mapping, Sequence

from tether.envs.base import Action, EnvSpec, Observation, StepResult, register_env
from tether.types import Message

SYSTEM = "Commands: go to X, open X, take X, put X in X"
OPEN = ("table", "shelf", "counter", "desk")
CLOSED = ("drawer", "cabinet", "fridge", "box")
OBJECTS = ("apple", "mug", "key", "pen", "book", "cup", "plate", "spoon", "sock", "coin")


def preposition(receptacle: str) -> str:
    return "in" if receptacle in CLOSED else "on"


def make_household_task(rng: random.Random, i: int, kw: dict[str, Any]) -> dict[str, Any]:
    """A room (receptacles, objects on the open ones) and a goal: move one object elsewhere."""
    n_rec, n_obj = int(kw.get("receptacles", 4)), int(kw.get("objects", 3))
    if not 2 <= n_rec <= len(OPEN) + len(CLOSED) or not 1 <= n_obj <= len(OBJECTS):
        raise ValueError(f"household: receptacles in 2..8, objects in 1..10 (got {n_rec}, {n_obj})")
    opened = rng.sample(OPEN, rng.randint(1, min(len(OPEN), n_rec - 1)))
    recs = opened + rng.sample(CLOSED, n_rec - len(opened))
    rng.shuffle(recs)
    objects = rng.sample(OBJECTS, n_obj)
    layout = {r: [] for r in recs}
    for o in objects:
        layout[rng.choice(opened)].append(o)
    goal_obj = rng.choice(objects)
    source = next(r for r in recs if goal_obj in layout[r])
    goal = rng.choice([r for r in recs if r != source])
    task = {"id": f"household-{i}", "receptacles": recs, "layout": layout, "object": goal_obj, "goal": goal,
            "answer": f"{goal_obj} {goal}", "subgoal_reward": float(kw.get("subgoal_reward", 0.0))}
    # the whole first observation is the prompt: held-out problems are unseen rooms, not just unseen goals
    seen = f"The {goal_obj} is {preposition(source)} the {source}."
    return {**task, "prompt": f"{World(task).describe()} {seen} Task: put the {goal_obj} {preposition(goal)} the {goal}."}


class World:
    """The room's state: contents, which receptacles are open, where the agent is, what it holds."""

    def __init__(self, task: Mapping[str, Any]) -> None:
        self.contents = {r: list(v) for r, v in task["layout"].items()}
        self.open = {r: r in OPEN for r in task["receptacles"]}
        self.at: str | None = None
        self.holding: str | None = None
        self.placed: tuple[str, str] | None = None  # (object, receptacle) of the last put

    def _list(self, r: str) -> str:
        return ", ".join(self.contents[r]) or "nothing"

    def describe(self) -> str:
        return "You see: " + ", ".join(r if self.open[r] else f"{r} (closed)" for r in self.contents) + "."

    def apply(self, command: str) -> str:
        """Execute one command; returns the observation text."""
        c = " ".join(re.findall(r"[a-z]+", command.lower()))
        if m := re.fullmatch(r"go to (?:the )?(\w+)", c):
            r = m.group(1)
            if r not in self.contents:
                return "Nothing happens."
            self.at = r
            return f"At the {r}: {self._list(r)}." if self.open[r] else f"At the {r}. It is closed."
        if m := re.fullmatch(r"open (?:the )?(\w+)", c):
            r = m.group(1)
            if r != self.at or self.open[r]:
                return "Nothing happens."
            self.open[r] = True
            return f"The {r} is open: {self._list(r)}."
        if m := re.fullmatch(r"take (?:the )?(\w+)(?: from (?:the )?\w+)?", c):
            o = m.group(1)
            if self.holding or self.at is None or not self.open[self.at] or o not in self.contents[self.at]:
                return "Nothing happens."
            self.contents[self.at].remove(o)
            self.holding = o
            return f"You hold the {o}."
        if m := re.fullmatch(r"put (?:the )?(\w+) (?:in|on|into|onto) (?:the )?(\w+)", c):
            o, r = m.groups()
            if o != self.holding or r != self.at or not self.open[r]:
                return "Nothing happens."
            self.contents[r].append(o)
            self.holding, self.placed = None, (o, r)
            return f"You put the {o} {preposition(r)} the {r}."
        return "Nothing happens."


class HouseholdEnv:
    """One episode (single use): text commands until the goal object is put down."""

    tools: tuple = ()

    def __init__(self, task: Mapping[str, Any]) -> None:
        self.task = task
        self.world = World(task)
        self.subgoal_reward = float(task.get("subgoal_reward", 0.0))
        self.reached: set[str] = set()

    def subgoals(self) -> set[str]:
        """The subgoals of the plan reached in the current state (take, arrive, open)."""
        w, t, out = self.world, self.task, set()
        if w.holding == t["object"]:
            out.add("take")
            if w.at == t["goal"]:
                out.add("arrive")
        if t["goal"] in CLOSED and w.open[t["goal"]] and "arrive" in self.reached:
            out.add("open")
        return out

    def reset(self) -> Observation:
        return Observation((Message("system", SYSTEM), Message("user", self.task["prompt"])))

    def step(self, action: Action) -> StepResult:
        lines = [ln for ln in action.text.strip().splitlines() if ln.strip()]
        obs = self.world.apply(lines[0] if lines else "")
        new = self.subgoals() - self.reached
        self.reached |= new
        dense = self.subgoal_reward * len(new)
        placed = self.world.placed
        if placed is not None and placed[0] == self.task["object"]:
            correct = placed[1] == self.task["goal"]
            return StepResult(Observation((Message("user", obs),)), float(correct) + dense, True,
                              {"correct": correct, "subgoals": len(self.reached)})
        return StepResult(Observation((Message("user", obs),)), dense, False, {"correct": False})


def replay(task: Mapping[str, Any], history: Sequence[Message]) -> tuple[World, str | None]:
    """The world after the assistant's commands in `history`, and where it went after taking."""
    world, dest = World(task), None
    for m in history:
        if m.role == "assistant":
            lines = [ln for ln in m.content.strip().splitlines() if ln.strip()]
            world.apply(lines[0] if lines else "")
            if world.holding and m.content.startswith("go to"):
                dest = world.at
    return world, dest


def household_expert(task: Mapping[str, Any], history: Sequence[Message]) -> str:
    """Go to the object, take it, go to the goal, open it if closed, put the object there."""
    world, dest = replay(task, history)
    obj = task["object"]
    if world.holding != obj:
        source = next((r for r, v in world.contents.items() if obj in v), None)
        if source is None:  # already placed (the episode is over)
            return "look"
        return f"take {obj}" if world.at == source else f"go to {source}"
    if dest is None:
        return f"go to {task['goal']}"
    if not world.open[dest]:
        return f"open {dest}"
    return f"put {obj} {preposition(dest)} {dest}"


def household_mistake(task: Mapping[str, Any], history: Sequence[Message], action: str,
                      rng: random.Random) -> str | None:
    """Carrying the object, go to a wrong receptacle (the expert then finishes there)."""
    if action != f"go to {task['goal']}":
        return None
    world, _ = replay(task, history)
    wrong = [r for r in task["receptacles"] if r not in (task["goal"], world.at)]
    return f"go to {rng.choice(wrong)}" if wrong else None


@register_env("household")
def household_env() -> EnvSpec:
    return EnvSpec("household", make_household_task, HouseholdEnv, household_expert,
                   "ALFWorld-like text household: go to, open, take, put", household_mistake)
