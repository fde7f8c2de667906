"""Every reason code the featurizer writes to ``deadletter`` (and rejected receipts), with its
meaning: the envelope's, the core's, and those of remove wins, signed mode and sealed inputs."""

from __future__ import annotations

from unlearn.schemas.request_errors import REQUEST_REASONS
from unlearn.streams.featurizer.auth import AUTH_REASONS
from unlearn.streams.featurizer.events import EVENT_REASONS
from unlearn.streams.featurizer.tombstones import TOMBSTONE_REASONS
from unlearn.streams.featurizer.transit_open import TRANSIT_REASONS

__all__ = ["FEATURIZER_REASONS"]

FEATURIZER_REASONS: dict[str, str] = {
    **{k: f"request envelope: {v}" for k, v in REQUEST_REASONS.items()},
    "duplicate_add": "an add for a (head, sample) already in the feature cache (never a double count)",
    "unknown_sample": "a delete for a (head, sample) not in the feature cache (no longer written: such a delete "
                      "leaves a tombstone and a 'tombstoned' receipt; kept for older dead letters)",
    "unknown_subject": "a delete_subject for a subject with no cached sample in that head (no longer written, as "
                       "unknown_sample)",
    "subject_mismatch": "a delete whose subject_id differs from the subject that added the sample",
    "wrong_client": "federated mode: the request's client_id is not this site's client",
    "dimension_mismatch": "the feature dimension differs from the head's contract or first add",
    "dimension_too_large": "a new head's dimension exceeds UNLEARN_MAX_FEATURE_DIM",
    "backbone_mismatch": "the input kind/backbone differs from the head's, or the head's configured "
                         "backbone does not take this input kind",
    "backbone_unavailable": "the backbone cannot be loaded (unknown name, package or weights missing)",
    "undecodable_input": "the backbone refused the input (corrupt image, empty text, ...)",
    "encode_failed": "the backbone raised on this input while the rest of its batch encoded",
    "non_finite_feature": "a feature (or its L2 norm) is NaN or infinite",
    "zero_norm_feature": "a vector with no information: its L2 norm is below 1e-12 (all zeros, all -0.0, "
                         "subnormals), so it cannot be normalized; without normalization, one whose q is all zeros",
    "image_too_large": "an image declaring more pixels (width x height) than UNLEARN_MAX_IMAGE_PIXELS, refused "
                       "from its header before anything is decoded",
    "feature_out_of_bound": "a feature component exceeds UNLEARN_FEATURE_BOUND (never clipped)",
    "label_out_of_range": "a class index outside the head's declared label space (its contract's n_classes; "
                          "UNLEARN_DEFAULT_CLASSES for an auto-created head), a label vector wider than "
                          "UNLEARN_MAX_CLASSES or 2^20, or a quantized target beyond 2^30",
    "undeclared_head": "an add to a head with no contract in the head registry while UNLEARN_AUTO_CREATE_HEADS "
                       "is off",
    "contract_conflict": "the head's cached grid (fixed by its first add) differs from its declared contract",
    "label_mismatch": "class-index vs vector label, or another vector width, than the head's contract or first add",
    "soft_label_needs_label_frac_bits": "non-integer label values while UNLEARN_LABEL_FRAC_BITS=0",
    **TOMBSTONE_REASONS,
    **EVENT_REASONS,
    **AUTH_REASONS,
    **TRANSIT_REASONS,
}
"""Every reason code the featurizer writes to ``deadletter`` (and rejected receipts)."""
