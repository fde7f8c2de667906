"""predict.json: serving's supersedes rule and predictions on fixed heads and inputs, so the
Java HeadFollower serves and predicts as serving does (to 1e-12)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np

from clients.vectors.heads import with_classes
from clients.vectors.json_bytes import b64, f64_hex
from unlearn.schemas.head import HeadUpdate, encode_head
from unlearn.schemas.head_contract import HeadContract
from unlearn.services.serving.predict import HeadStore, PredictError, predict, prepare_inputs


def contract(head_id: str, d: int, c: int, version: int = 1, frac_bits: int = 20, bound: float = 1.0,
             normalization: str = "l2") -> HeadContract:
    """A features head's contract: the quantization (frac_bits, bound, normalization) predictions use."""
    return HeadContract(head_id, version, d, "features", "features", normalization,  # type: ignore[arg-type]
                        bound, frac_bits, 0, "class", 1.0, n_classes=max(c, 1))


def gen_predict() -> dict[str, Any]:
    """Sequences of head updates offered to serving's HeadStore (the supersedes rule, the
    posterior kept from the last exact update), then predictions of serving's predict with the
    head's contract: quantized rows, scores, predicted class, variance (or the refusal)."""
    rng = np.random.default_rng(2026)

    def spd(d: int) -> np.ndarray:
        a = rng.standard_normal((d, d))
        return np.linalg.inv(a @ a.T + 0.5 * np.eye(d))

    def upd(hid: str, version: int, mode: str, d: int, c: int, post: bool, cv: int | None) -> HeadUpdate:
        return HeadUpdate(hid, version, mode, rng.bytes(32).hex() if mode == "exact" else None,  # type: ignore[arg-type]
                          100 + version, 100 + version, [(0, version)], 0.0, 1.0, float(version),
                          rng.standard_normal((d, c)), spd(d) if post else None, None, cv)

    settings_default = {"frac_bits": 30, "feature_bound": 1.0, "normalize": True}  # Settings() defaults
    scenarios: list[dict[str, Any]] = []

    def scenario(name: str, updates: list[HeadUpdate], contracts: list[HeadContract],
                 inputs: list[list[float]], sigma2: float = 1.0, top_k: int = 1) -> None:
        store = HeadStore()
        offers = []
        for u in updates:
            offers.append({"message": b64(encode_head(u)), "result": store.offer(u, now=0.0)})
        head_id = updates[0].head_id
        served = store.get(head_id)
        assert served is not None
        by_version = {c.version: c for c in contracts}
        latest = max(contracts, key=lambda c: c.version) if contracts else None
        want = served.update.contract_version
        con = by_version.get(want) if want is not None else None
        con = con or latest
        from unlearn.infra.settings import Settings

        results = []
        for x in inputs:
            entry: dict[str, Any] = {"features": x}
            try:
                X = prepare_inputs(Settings(), served, "features", [np.asarray(x, dtype=np.float64)], con)
            except PredictError as exc:
                entry["error"] = exc.reason
                results.append(entry)
                continue
            out = predict(served, X, sigma2, top_k)
            p = out["predictions"][0]
            fb = con.frac_bits if con is not None else settings_default["frac_bits"]
            entry.update({"q": [int(v) for v in np.rint(X[0] * 2.0 ** fb).astype(np.int64)],
                          "x_f64le": f64_hex(X[0]), "scores": p["scores"], "predicted_class": p["predicted_class"],
                          "variance": p["variance"], "top_classes": p.get("top_classes", [p["predicted_class"]])})
            results.append(entry)
        scenarios.append({
            "name": name, "sigma2": sigma2, "top_k": top_k, "offers": offers,
            "contracts": [c.to_dict() for c in contracts],
            "served": {"version": served.update.version, "mode": served.update.mode,
                       "posterior_version": served.posterior_version,
                       "posterior_source": served.posterior_source,
                       "contract_version": con.version if con is not None else None},
            "predictions": results,
        })

    d, c = 4, 3
    base_inputs = [[0.5, -0.25, 0.125, 1.0], [3.0, 4.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0],
                   [1e-3, -2e-3, 3e-3, 4e-3], [1.0, 1.0, 1.0],
                   [1e-9, -2e-9, 0.0, 5e-10], [1e-13, 0.0, -3e-14, 0.0]]  # tiny norms: the 1e-12 floor
    exact = upd("faces", 5, "exact", d, c, True, 1)
    fast = upd("faces", 6, "fast", d, c, False, 1)
    scenario("exact_then_fast_keeps_posterior", [exact, fast], [contract("faces", d, c)], base_inputs)
    scenario("stale_and_tie", [upd("faces", 8, "fast", d, c, False, 2), upd("faces", 7, "exact", d, c, True, 2),
                               upd("faces", 8, "exact", d, c, True, 2), upd("faces", 8, "fast", d, c, False, 2)],
             [contract("faces", d, c), contract("faces", d, c, 2)], base_inputs, sigma2=0.5)
    scenario("no_posterior", [upd("nopost", 1, "fast", d, 2, False, None)], [contract("nopost", d, 2, frac_bits=16)],
             base_inputs)
    scenario("no_normalization_bound", [upd("raw", 3, "exact", 3, 2, True, 1)],
             [contract("raw", 3, 2, frac_bits=12, bound=4.0, normalization="none")],
             [[1.5, -3.999, 0.1], [4.0, -4.0, 0.0], [4.5, 0.0, 0.0], [1e-9, 2.5e-4, 3.0]])
    scenario("contract_version_chosen", [upd("cv", 9, "exact", 3, 2, True, 1)],
             [contract("cv", 3, 2, 1, frac_bits=8), contract("cv", 3, 3, 2, frac_bits=8)],
             [[0.3, 0.4, 0.5], [0.123456789, -0.987654321, 0.5]])
    scenario("no_contract_settings_fallback", [upd("legacy", 2, "exact", 3, 2, True, None)], [],
             [[0.3, 0.4, 0.5], [1.0, 2.0, 3.0]])
    # half-way points: rint is round-half-even (2.5 -> 2, 3.5 -> 4), in the grid 2^-1
    scenario("round_half_even", [upd("half", 1, "exact", 4, 1, True, 1)],
             [contract("half", 4, 1, frac_bits=1, bound=4.0, normalization="none")],
             [[1.25, 1.75, -1.25, -1.75], [0.25, 0.75, -0.25, 3.75]])
    big = upd("wide", 1, "exact", 32, 5, True, 1)
    scenario("wide", [big], [contract("wide", 32, 5, frac_bits=24)],
             [list(rng.standard_normal(32)) for _ in range(3)])
    scenario("retained_classes_only", [with_classes(upd("cls", 3, "exact", 4, 5, True, 1),
                                                    [False, True, False, True, True])],
             [contract("cls", 4, 5)], base_inputs, top_k=2)
    scenario("retained_classes_top_k_clipped", [with_classes(upd("cls", 4, "fast", 4, 5, False, 1),
                                                             [False, False, True, False, True])],
             [contract("cls", 4, 5)], base_inputs[:2], top_k=4)
    scenario("no_retained_class", [with_classes(upd("cls0", 2, "exact", 4, 3, True, 1), [False, False, False])],
             [contract("cls0", 4, 3)], base_inputs[:2], top_k=3)
    tie = upd("tie", 1, "exact", 2, 4, True, 1)
    tie = replace(tie, weights=np.array([[1.0, 2.0, 2.0, 2.0], [0.0, 0.0, 0.0, 0.0]]))
    scenario("ties_lowest_index", [with_classes(tie, [True, False, True, True])], [contract("tie", 2, 4)],
             [[1.0, 0.0], [-1.0, 0.0]], top_k=3)
    return {"about": "serving's HeadStore.offer over 'offers' (results accepted|stale: HeadUpdate.supersedes), "
                     "then services/serving/predict (prepare_inputs with the head's contract: the one whose "
                     "version the served update names, else the latest; none: Settings defaults frac_bits 30, "
                     "bound 1, l2) on each input: q, the dequantized row bits, scores, predicted class, "
                     "variance (null without a posterior), top_k classes ranked over the retained classes only (a null "
                     "score: not a retained class), or the refusal reason", "scenarios": scenarios}
