"""Sibling harnesses (Harness-S): a base harness plus a patch of typed edits, as data.

``edits.py`` holds the edit contract and registry, ``kinds.py`` the built-in kinds,
``patch.py`` patches, siblings, their YAML files and content hash, ``components.py`` the
wrapped components, and ``build.py`` turns a sibling into a ``Harness``. Importing the
package registers the built-in kinds and lets ``Harness.named`` build pool members ``DIR#ID``.
"""

from harnessrl.harness.harness import SIBLING_SEPARATOR, register_name_resolver
from harnessrl.harness.siblings.build import build, build_member, split_member
from harnessrl.harness.siblings.edits import (
    Edit,
    EditFieldError,
    PatchError,
    SiblingParts,
    edit_class,
    edit_kinds,
    register_edit,
)
from harnessrl.harness.siblings.kinds import (
    GuardRule,
    Hook,
    Limits,
    RecoveryRule,
    SetLevel,
    Skill,
    SystemAddendum,
    ToolHint,
)
from harnessrl.harness.siblings.patch import (
    BASE_ID,
    SIBLINGS_FOLDER,
    Patch,
    Sibling,
    load_sibling,
    save_sibling,
    sibling_file,
    sibling_ids,
)

__all__ = [
    "BASE_ID", "SIBLINGS_FOLDER", "Edit", "EditFieldError", "GuardRule", "Hook", "Limits", "Patch", "PatchError",
    "RecoveryRule", "SetLevel", "Sibling", "SiblingParts", "Skill", "SystemAddendum", "ToolHint", "build",
    "build_member", "edit_class", "edit_kinds", "load_sibling", "register_edit", "save_sibling", "sibling_file",
    "sibling_ids", "split_member",
]

# Pool members are harness names too: `Harness.named("DIR#ID")` builds them.
register_name_resolver(lambda name: SIBLING_SEPARATOR in name, build_member)
