"""harnessrl inside verl (the ``harnessrl[verl]`` extra): every harness configuration as a verl
agent loop, the parquet dataset that follows the pairing schedule, and the rescue hook.

``sequence``, ``dataset`` and ``rescue`` need nothing of verl; ``agent_loop`` imports verl and
registers the agent loop ``harnessrl`` when it is imported (verl's trainer imports it through
``actor_rollout_ref.rollout.agent.agent_loop_config_path``; see ``examples/verl``).
"""

AGENT_NAME = "harnessrl"
"""The ``agent_name`` of every row the dataset builder writes, and the registry key."""
