"""The learned drafters' heads: the modules (``modules``: EAGLE and Medusa, shared with training),
a head on disk and its target (``files``), and what drafting with one needs (``runtime``).

Arrows point down: training (``specserve.train``) imports these modules; nothing here imports it.
"""

from specserve.drafters.heads.files import (FORMAT_VERSION, check_target, load_head, new_config, save_head,
                                            target_signature)
from specserve.drafters.heads.modules import MODULES, EagleHead, HeadConfig, MedusaHeads, build, rotary

__all__ = ["FORMAT_VERSION", "MODULES", "EagleHead", "HeadConfig", "MedusaHeads", "build", "check_target",
           "load_head", "new_config", "rotary", "save_head", "target_signature"]
