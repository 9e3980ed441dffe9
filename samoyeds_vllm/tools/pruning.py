"""How `convert` chooses and corrects the weights it keeps, one weight matrix (or a batch of experts) at a time.

- magnitude: keep the largest |W| (samoyeds_vllm.format.prune's default; needs no data);
- wanda: keep the largest |W_ij| * ||X_j||, the norm of input channel j over the calibration inputs this weight
  really sees (Sun et al., 2023);
- sparsegpt: second-order one-shot pruning (Frantar & Alistarh, 2023). With H = X^T X over the weight's
  calibration inputs, sweep the input columns left to right; dropping w_j costs w_j^2 / [H^-1]_jj (the OBS
  saliency, U_jj^2 with U the upper Cholesky factor of H^-1), and the columns not yet swept absorb the error
  through the OBS update. Columns go in blocks of 128 with lazy batched updates of the later columns.
  2:4 picks, at the start of every group of 4 inputs, the 2 lowest saliencies of each row (the paper's
  semi-structured variant). samoyeds picks, at the start of every segment of V inputs, the row of each row pair
  that keeps the larger 2:4 saliency over the segment, which is prune_mask's rule on saliencies instead of |W|;
  the other row's segment is dropped, then 2:4 runs inside the kept row as above.

The inputs and Hessians come from samoyeds_vllm.tools.calibration; this module only does the per-matrix math.
"""

from __future__ import annotations

import torch

from ..format import Pattern, prune_mask
from ..format.pattern import GROUP

METHODS = ("magnitude", "wanda", "sparsegpt")
#: Methods that need calibration data (convert runs them layer by layer).
CALIBRATED = ("wanda", "sparsegpt")
#: SparseGPT's dampening: this fraction of the mean diagonal of H is added to it (the paper's 1%).
DAMP = 0.01
#: Columns per lazy-update block; a multiple of every samoyeds segment, so a segment never straddles blocks.
BLOCK = 128


def wanda_scores(w: torch.Tensor, input_norms: torch.Tensor) -> torch.Tensor:
    """Wanda importance |W_ij| * ||X_j||: weight magnitude scaled by the L2 norm of input channel j over
    calibration activations (`input_norms` [in], or [..., in] batched like `w`)."""
    return w.abs().float() * input_norms.float().unsqueeze(-2)


def _inverse_hessian_factor(hessian: torch.Tensor, damp: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Upper Cholesky factor U of (H + damp * mean(diag H) * I)^-1, per batch entry, and the dead inputs (H_jj = 0:
    never seen nonzero, so their weights are dropped for free). Dampening grows tenfold where the factorisation
    fails (a rank-deficient H of an expert that saw few tokens)."""
    h = hessian.double().clone()
    diag = h.diagonal(dim1=-2, dim2=-1)
    dead = diag == 0
    diag[dead] = 1.0
    eye = torch.eye(h.shape[-1], dtype=h.dtype, device=h.device)
    scale = damp * diag.mean(-1)
    for _ in range(6):
        chol, info = torch.linalg.cholesky_ex(h + scale[..., None, None] * eye)
        if not bool((info > 0).any()):
            break
        scale = torch.where(info > 0, scale * 10, scale)
    else:
        raise RuntimeError("the calibration Hessian stays singular under dampening")
    inverse = torch.cholesky_inverse(chol)
    return torch.linalg.cholesky(inverse, upper=True).float(), dead


def sparsegpt(w: torch.Tensor, hessian: torch.Tensor, pattern: Pattern, damp: float = DAMP) -> torch.Tensor:
    """SparseGPT onto `pattern`: w [..., m, k], hessian [..., k, k] (X^T X of the inputs, any positive scale).
    Returns the pruned and corrected weights in float32 [..., m, k]; they satisfy the pattern exactly."""
    lead = w.shape[:-2]
    m, k = w.shape[-2:]
    pattern.check_shape(w.shape)
    W = w.float().reshape(-1, m, k).clone()
    U, dead = _inverse_hessian_factor(hessian.reshape(-1, k, k), damp)
    W.masked_fill_(dead.unsqueeze(1), 0.0)
    segment = pattern.segment if pattern.is_samoyeds else None

    for i1 in range(0, k, BLOCK):
        i2 = min(i1 + BLOCK, k)
        W1 = W[..., i1:i2].clone()
        Q1 = torch.zeros_like(W1)
        Err1 = torch.zeros_like(W1)
        U1 = U[:, i1:i2, i1:i2]
        d1 = U1.diagonal(dim1=-2, dim2=-1)  # [B, count]: sqrt([H^-1]_jj) at the time column j is swept
        drop = torch.zeros_like(W1, dtype=torch.bool)
        kept_row = None
        for i in range(i2 - i1):
            if segment and (i1 + i) % segment == 0:
                saliency = W1[..., i : i + segment].square() / d1[:, None, i : i + segment].square()
                kept_row = prune_mask(saliency, pattern).any(-1, keepdim=True)  # [B, m, 1]
            if i % GROUP == 0:
                saliency = W1[..., i : i + GROUP].square() / d1[:, None, i : i + GROUP].square()
                keep = torch.zeros_like(saliency, dtype=torch.bool).scatter_(-1, saliency.topk(2, dim=-1).indices, True)
                drop[..., i : i + GROUP] = ~(keep & kept_row) if segment else ~keep
            col = W1[..., i]
            q = col.masked_fill(drop[..., i], 0.0)
            Q1[..., i] = q
            err = (col - q) / d1[:, i, None]
            W1[..., i:] -= err.unsqueeze(-1) * U1[:, i, i:].unsqueeze(1)
            Err1[..., i] = err
        W[..., i1:i2] = Q1
        W[..., i2:] -= Err1 @ U[:, i1:i2, i2:]
    return W.reshape(*lead, m, k)


def output_error(w: torch.Tensor, pruned: torch.Tensor, hessian: torch.Tensor) -> tuple[float, float]:
    """(||X W^T - X P^T||^2, ||X W^T||^2) summed over the batch, from H = X^T X alone: tr(D H D^T) for D = W - P."""
    diff = w.double() - pruned.double()
    h = hessian.double()
    err = float(((diff @ h) * diff).sum())
    ref = float(((w.double() @ h) * w.double()).sum())
    return err, ref
