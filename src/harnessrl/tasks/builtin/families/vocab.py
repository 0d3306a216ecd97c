"""Split vocabularies of the workspace suite: train and test draw every name from disjoint pools.

File and folder names, people, items, places, categories, table and column names, error
codes and year ranges all come from the split's own pool, so a test task never shows a
name a train task used (``tests/test_builtin_workspace.py`` pins this down).
"""

from __future__ import annotations

from dataclasses import dataclass, fields


@dataclass(frozen=True)
class Vocabulary:
    """The names one split may use; every field of train is disjoint from the same field of test."""

    words: tuple[str, ...]  # stems of file and folder names
    people: tuple[str, ...]
    items: tuple[str, ...]
    places: tuple[str, ...]
    categories: tuple[str, ...]
    statuses: tuple[str, ...]  # one of them is the "closed" status used by rules
    code_prefix: str  # prefix of incident codes searched for in logs
    marker: str  # the to-do marker counted by search tasks
    years: tuple[int, ...]

    def all_names(self) -> set[str]:
        """Returns every name of this vocabulary, lowercased (years as strings)."""
        names: set[str] = set()
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, tuple):
                names.update(str(v).lower() for v in value)
            else:
                names.add(str(value).lower())
        return names


TRAIN = Vocabulary(
    words=(
        "otter", "falcon", "maple", "badger", "heron", "willow", "lynx", "cedar", "beaver",
        "sparrow", "aspen", "walrus", "orchid", "pelican", "hazel", "bison", "juniper",
        "marten", "plover", "thistle", "ferret", "alder", "gecko", "magpie", "birch", "lemur",
        "tulip", "puffin", "yarrow", "coyote", "clover", "osprey", "rowan", "kestrel",
        "sorrel", "moose", "poppy", "finch", "larch", "stoat", "daisy", "wren", "fennel",
        "vole", "lupin", "robin", "acorn", "hedgehog", "bramble", "raven", "nettle", "salmon",
        "tansy", "panda", "ibis", "laurel", "newt", "basil", "quail", "tamarack", "toad",
        "holly", "dingo", "lilac", "egret", "myrtle", "jackal", "aster", "gull", "peony",
        "weasel", "hemlock", "shrew", "mallard", "cypress", "bobcat", "primrose", "lark",
        "elk", "spruce", "iguana", "violet", "cormorant", "sequoia", "hornet", "fir",
    ),
    people=(
        "amara", "bjorn", "chen", "dalia", "emeka", "farah", "goran", "hana", "ivo", "jonas",
        "kira", "lior", "mateo", "nadia", "oskar", "priya", "quinn", "rosa", "soren", "tariq",
        "uma", "viktor", "wanda", "xavi", "yara", "zane",
    ),
    items=(
        "lantern", "kettle", "backpack", "compass", "hammock", "thermos", "skillet", "trowel",
        "binoculars", "canteen", "hatchet", "tarp", "whistle", "headlamp", "poncho", "stove",
        "carabiner", "sleepingbag", "mallet", "shears",
    ),
    places=("lisbon", "oslo", "dublin", "lyon", "porto", "turin", "bergen", "malmo", "ghent", "graz"),
    categories=("garden", "kitchen", "camping", "workshop", "outdoor", "pantry"),
    statuses=("active", "archived", "draft", "review"),
    code_prefix="ERR",
    marker="TODO",
    years=(2018, 2019, 2020, 2021),
)

TEST = Vocabulary(
    words=(
        "quasar", "basalt", "nebula", "granite", "pulsar", "obsidian", "comet", "feldspar",
        "zenith", "quartz", "nova", "gneiss", "aurora", "shale", "meteor", "pumice", "galaxy",
        "jasper", "photon", "cobalt", "argon", "helium", "zircon", "magma", "topaz", "boson",
        "krypton", "mica", "neon", "flint", "radon", "xenon", "gypsum", "lepton", "quark",
        "onyx", "opal", "garnet", "beryl", "talc", "plasma", "vortex", "eclipse", "corona",
        "equinox", "solstice", "asteroid", "cosmos", "crater", "kelvin", "tesla", "sigma",
        "dolomite", "perigee", "apogee", "parsec", "nadir", "umbra", "zodiac", "lumen",
    ),
    people=(
        "anouk", "bastien", "cyrus", "delphine", "eitan", "freya", "gideon", "hiroshi",
        "ingrid", "javier", "keanu", "leilani", "marek", "nkechi", "ottilie", "pavel", "rahel",
        "sanjay", "thea", "ulrich", "vesna", "wim", "yusuf", "zofia",
    ),
    items=(
        "keyboard", "monitor", "router", "webcam", "stylus", "charger", "headset", "tablet",
        "speaker", "printer", "scanner", "projector", "dongle", "trackpad", "modem", "joystick",
    ),
    places=("osaka", "quito", "lagos", "perth", "hanoi", "lima", "accra", "busan", "cusco", "dakar"),
    categories=("audio", "office", "network", "gaming", "storage", "display"),
    statuses=("live", "shelved", "parked", "frozen"),
    code_prefix="FAULT",
    marker="FIXME",
    years=(2023, 2024, 2025, 2026),
)

VOCABULARIES: dict[str, Vocabulary] = {"train": TRAIN, "test": TEST}
