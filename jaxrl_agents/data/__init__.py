"""Episode records and the padded batches the learner trains on."""

from jaxrl_agents.data.packing import bucket, loss_index_width, pack
from jaxrl_agents.data.trajectory import ACTION, PROMPT, Batch, Trajectory

__all__ = ["ACTION", "PROMPT", "Batch", "Trajectory", "bucket", "loss_index_width", "pack"]
