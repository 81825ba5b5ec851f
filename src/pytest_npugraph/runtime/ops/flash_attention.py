"""Training flash attention: ``npu_fusion_attention`` and ``npu_fusion_attention_grad``.

What model code calls: transformers' Ascend flash-attention path (``integrations/npu_flash_attention``)
runs ``npu_fusion_attention(q, k, v, head_num, "BSND"|"TND", scale=, keep_prob=, atten_mask=<2048x2048
upper triangle>, sparse_mode=2|3, actual_seq_qlen=/actual_seq_kvlen=<cumulative>)[0]``; MindSpeed and
vLLM-Ascend's training paths call the same op and its grad.

Semantics (torch_npu 2.14.0 docs, its meta kernel and op-plugin's argument checks):

* ``y = Softmax(Mask(scale * (QK^T + pse), atten_mask)) [Dropout keep_prob] V``; with ``sink`` (one
  logit per head) an extra column joins the softmax and is dropped before ``V``;
* layouts BSH, SBH, BSND, BNSD and TND (varlen: ``actual_seq_qlen``/``actual_seq_kvlen`` are cumulative
  token counts; a trailing 0 marks a batch that does not take part); GQA: query head h reads KV head
  ``h // (Nq / Nkv)``; value may have a smaller head dim than key;
* atten_mask: True/1 = masked.  No mask: everything is computed and sparse_mode/pre/next are ignored.
  sparse_mode 0 (the mask, plus the pre/next-token band from the top-left), 1 (the mask), 2 (causal
  from the top-left), 3 (causal from the bottom-right), 4 (band from the bottom-right), 5 (the mask,
  uncompressed prefix), 6 (bottom-right causal plus the first ``prefix[b]`` keys), 7/8 (varlen split
  sequences: the last/first batch is a bottom-right band, the others causal from the bottom-right/
  top-left); modes 2-4 and 6-8 take the compressed mask and compute the pattern themselves;
* a query row with every key masked gives 0 (the kernel's invalid-row handling);
* softmax_max / softmax_sum: the row max of the scaled scores and the sum of ``exp(score - max)``,
  repeated over a last dim of 8: (B, N, Sq, 8), or (T, N, 8) for TND whose memory holds N-major
  (NTD) rows unless ``softmax_layout="TND"``; softmax_out is the reserved empty tensor;
* dropout (``keep_prob < 1``): the keep-mask comes from (seed, offset) drawn from the default
  generator, so the grad regenerates the same mask from the seed/offset the forward returned;
  ``numels`` is the mask's element count, as the kernel reports it.
"""
from __future__ import annotations

from typing import List, Optional, Sequence

import torch

from ._common import _check, _unsupported
from .spec import OpSpec, mix

_FA = "npu_fusion_attention"
_LAYOUTS = ("BSH", "SBH", "BNSD", "BSND", "TND")
_STAT_WIDTH = 8          # softmax_max/softmax_sum repeat each row statistic 8 times




# ----------------------------------------------------------------------------- argument checks
def _check_common(query, key, value, input_layout: str, keep_prob: float, sparse_mode: int,
                  tensors=("query", "key", "value"), extra=None) -> str:
    """op-plugin's checks shared by the forward and the grad; returns the upper-cased layout."""
    for name, t in zip(tensors, (query, key, value) + (() if extra is None else (extra,))):
        _check(t.dim() in (3, 4), lambda: f"The shapes of the input {name} should be 3 or 4 dimensional, "
                                          f"but got {t.dim()}-dimensional")
    _check(0 < keep_prob <= 1, lambda: f"The keep_prob value must be in range of (0, 1], but got {keep_prob}")
    if input_layout == "TND":
        _check(0 <= sparse_mode <= 8 and sparse_mode != 5,
               lambda: f"The sparse_mode value must be in range of [0,5) or (5,8], but got {sparse_mode}")
    else:
        _check(0 <= sparse_mode <= 6, lambda: f"The sparse_mode value must be in range of [0,6], but got {sparse_mode}")
    layout = input_layout.upper()
    _check(layout in _LAYOUTS, lambda: "The input_layout should be BSH/SBH/BNSD/BSND/TND(case-insensitive), "
                                       f"but got {input_layout}")
    return layout


# ----------------------------------------------------------------------------- layouts
def _to_bnsd(t: torch.Tensor, layout: str, heads: int) -> torch.Tensor:
    if layout == "BSH":
        return t.reshape(t.size(0), t.size(1), heads, -1).transpose(1, 2)
    if layout == "SBH":
        return t.reshape(t.size(0), t.size(1), heads, -1).permute(1, 2, 0, 3)
    if layout == "BSND":
        return t.transpose(1, 2)
    return t


def _from_bnsd(t: torch.Tensor, layout: str) -> torch.Tensor:
    if layout == "BSH":
        return t.transpose(1, 2).flatten(2)
    if layout == "SBH":
        return t.permute(2, 0, 1, 3).flatten(2)
    if layout == "BSND":
        return t.transpose(1, 2)
    return t


def _kv_heads(query, key, head_num: int, layout: str) -> int:
    if layout in ("BSH", "SBH"):
        d = query.size(2) // head_num
        return key.size(2) // d if d else 0
    return key.size(1) if layout == "TND" else key.size(2 if layout == "BSND" else 1)


def _ends(cumulative) -> List[int]:
    """Cumulative lengths with the trailing zeros (batches left out) held at the last end."""
    ends, last = [], 0
    for v in cumulative:
        last = max(last, int(v))
        ends.append(last)
    return ends


class _Batches:
    """q/k/v of one call as per-batch float32 (N, S, D) pieces, and the way back to the layout."""

    def __init__(self, query, key, value, head_num, layout, actual_seq_qlen, actual_seq_kvlen):
        self.layout, self.heads = layout, head_num
        self.kv_heads = _kv_heads(query, key, head_num, layout)
        _check(self.kv_heads > 0 and head_num % self.kv_heads == 0,
               lambda: f"{_FA}: head_num {head_num} must be a multiple of the key/value head number {self.kv_heads}")
        if layout == "TND":
            _check(actual_seq_qlen is not None and actual_seq_kvlen is not None
                   and len(actual_seq_qlen) != 0 and len(actual_seq_qlen) == len(actual_seq_kvlen),
                   "the size of actual_seq_qlen and actual_seq_kvlen must be the same and cannot be empty.")
            q_ends, kv_ends = _ends(actual_seq_qlen), _ends(actual_seq_kvlen)
            self.q_spans = list(zip([0] + q_ends[:-1], q_ends))
            self.kv_spans = list(zip([0] + kv_ends[:-1], kv_ends))
            self.tokens, self.kv_tokens = query.size(0), key.size(0)
            self.q = [query[lo:hi].transpose(0, 1).float() for lo, hi in self.q_spans]
            self.k = [key[lo:hi].transpose(0, 1).float() for lo, hi in self.kv_spans]
            self.v = [value[lo:hi].transpose(0, 1).float() for lo, hi in self.kv_spans]
        else:
            q4 = _to_bnsd(query, layout, head_num).float()
            self.q = list(q4)
            self.k = list(_to_bnsd(key, layout, self.kv_heads).float())
            self.v = list(_to_bnsd(value, layout, self.kv_heads).float())
        self.group = head_num // self.kv_heads

    def __len__(self) -> int:
        return len(self.q)

    def assemble(self, pieces: Sequence[torch.Tensor], dtype, kv: bool = False) -> torch.Tensor:
        """Per-batch (N, S, D) results back in the input layout (TND rows past the last end are 0);
        ``kv``: pieces shaped like key/value rather than query."""
        if self.layout == "TND":
            n, d = pieces[0].size(0), pieces[0].size(-1)
            out = pieces[0].new_zeros(self.kv_tokens if kv else self.tokens, n, d)
            for (lo, hi), piece in zip(self.kv_spans if kv else self.q_spans, pieces):
                out[lo:hi] = piece.transpose(0, 1)
            return out.to(dtype)
        return _from_bnsd(torch.stack(list(pieces)), self.layout).to(dtype)

    def statistic(self, rows: Sequence[torch.Tensor], softmax_layout: str) -> torch.Tensor:
        """Per-batch (N, Sq) row statistics as the kernel's softmax_max/softmax_sum tensor."""
        if self.layout != "TND":
            return torch.stack(list(rows)).unsqueeze(-1).expand(-1, -1, -1, _STAT_WIDTH).contiguous()
        ntd = rows[0].new_zeros(self.heads, self.tokens)
        for (lo, hi), row in zip(self.q_spans, rows):
            ntd[:, lo:hi] = row
        if softmax_layout == "TND":
            return ntd.transpose(0, 1).unsqueeze(-1).expand(-1, -1, _STAT_WIDTH).contiguous()
        # N-major memory in the (T, N, 8) tensor the kernel allocates
        return ntd.unsqueeze(-1).expand(-1, -1, _STAT_WIDTH).reshape(self.tokens, self.heads, _STAT_WIDTH).contiguous()

    def read_statistic(self, stat: torch.Tensor, b: int, softmax_layout: str) -> torch.Tensor:
        """Batch b's (N, Sq) rows of a softmax_max/softmax_sum tensor written by :meth:`statistic`."""
        if self.layout != "TND":
            return stat[b, :, :self.q[b].size(1), 0].float()
        lo, hi = self.q_spans[b]
        if softmax_layout == "TND":
            return stat[lo:hi, :, 0].transpose(0, 1).float()
        return stat.reshape(self.heads, self.tokens, _STAT_WIDTH)[:, lo:hi, 0].float()


# ----------------------------------------------------------------------------- masks
def _band(s_q: int, s_kv: int, shift: int, pre: int, nxt: int) -> torch.Tensor:
    """True where key j lies outside ``[i + shift - pre, i + shift + nxt]`` for query row i."""
    rel = torch.arange(s_kv).unsqueeze(0) - torch.arange(s_q).unsqueeze(1) - shift
    return (rel > nxt) | (rel < -pre)


def _given_mask(atten_mask: torch.Tensor, b: int, s_q: int, s_kv: int) -> torch.Tensor:
    """Batch b's slice of an SS / 11SS / B1SS / BNSS atten_mask as bool (1 or N, s_q, s_kv)."""
    m = atten_mask.to(torch.bool)
    if m.dim() == 2:
        m = m.unsqueeze(0)
    elif m.dim() == 4:
        m = m[b if m.size(0) > 1 else 0]
    else:
        m = m[b if m.size(0) > 1 else 0].unsqueeze(0)
    return m[..., :s_q, :s_kv]


def _mask(atten_mask, sparse_mode: int, b: int, batches: int, s_q: int, s_kv: int, pre: int, nxt: int,
          prefix) -> Optional[torch.Tensor]:
    """The boolean mask (True = masked) of batch b, or None when nothing is masked."""
    if atten_mask is None:
        return None
    right_down = s_kv - s_q
    if sparse_mode in (0, 1, 5):
        m = _given_mask(atten_mask, b, s_q, s_kv)
        return m | _band(s_q, s_kv, 0, pre, nxt) if sparse_mode == 0 else m
    if sparse_mode == 2 or (sparse_mode == 8 and b > 0):
        return _band(s_q, s_kv, 0, s_kv + s_q, 0)
    if sparse_mode == 3 or (sparse_mode == 7 and b < batches - 1):
        return _band(s_q, s_kv, right_down, s_kv + s_q, 0)
    if sparse_mode in (4, 7, 8):
        return _band(s_q, s_kv, right_down, pre, nxt)
    # 6: bottom-right causal, and the first prefix[b] keys visible to every row
    _check(prefix is not None and len(prefix) > b, lambda: f"{_FA}: sparse_mode 6 needs prefix for every batch")
    return _band(s_q, s_kv, right_down, s_kv + s_q, 0) & (torch.arange(s_kv) >= int(prefix[b])).unsqueeze(0)


def _pse_piece(pse: Optional[torch.Tensor], b: int, s_q: int, s_kv: int) -> Optional[torch.Tensor]:
    """Batch b's (N or 1, s_q or 1, s_kv) slice of a BNSS / BN1S / 1NSS pse."""
    if pse is None:
        return None
    _check(pse.dim() == 4, lambda: f"{_FA}: pse must be 4-dimensional (BNSS, BN1Skv or 1NSS), got {pse.dim()}-D")
    piece = pse[b if pse.size(0) > 1 else 0].float()
    if piece.size(-2) not in (1, s_q):
        raise _unsupported(_FA, "an alibi-compressed pse (the last 1024 rows only)")
    return piece[..., :s_q, :s_kv]


class _DropMask:
    """The keep-mask stream of one call, regenerated identically from (seed, offset) by the grad."""

    def __init__(self, keep_prob: float, seed: int, offset: int):
        self.keep_prob = keep_prob
        self.generator = None
        if keep_prob < 1:
            self.generator = torch.Generator().manual_seed((int(seed) * 0x9E3779B1 + int(offset)) % (2 ** 63))

    def next(self, shape) -> Optional[torch.Tensor]:
        if self.generator is None:
            return None
        return (torch.rand(shape, generator=self.generator) < self.keep_prob).float() / self.keep_prob


def _scores(q, k, group, scale, pse, mask):
    """Scaled (and masked: -inf) scores (N, s_q, s_kv) of one batch, K expanded to the query heads."""
    s = q @ k.repeat_interleave(group, dim=0).transpose(-1, -2)
    if pse is not None:
        s = s + pse
    s = s * scale
    return s if mask is None else s.masked_fill(mask, float("-inf"))


def _softmax_rows(s, sink):
    """Row max, exp-sum and probabilities of scores ``s`` (with an optional per-head sink logit).

    A row with every key masked keeps max -inf, sum 0 and probabilities 0."""
    full = s if sink is None else torch.cat((s, sink.float().reshape(-1, 1, 1).expand(-1, s.size(1), 1)), dim=-1)
    row_max = torch.nn.functional.pad(full, (0, 1), value=float("-inf")).amax(dim=-1)   # empty rows: -inf
    safe = torch.where(torch.isneginf(row_max), torch.zeros_like(row_max), row_max)
    e = torch.exp(full - safe.unsqueeze(-1))
    row_sum = e.sum(dim=-1)
    probs = e / torch.where(row_sum == 0, torch.ones_like(row_sum), row_sum).unsqueeze(-1)
    return row_max, row_sum, probs[..., :s.size(-1)], probs[..., s.size(-1):]


def _numels(layout, query, key, head_num, batches) -> int:
    if layout == "TND":
        return head_num * sum(q.size(1) * k.size(1) for q, k in zip(batches.q, batches.k))
    return sum(q.numel() // q.size(-1) * k.size(1) for q, k in zip(batches.q, batches.k))


# ----------------------------------------------------------------------------- the ops
def npu_fusion_attention(query, key, value, head_num: int, input_layout: str, pse=None, padding_mask=None,
                         atten_mask=None, scale: float = 1.0, keep_prob: float = 1.0, pre_tockens: int = 2147483647,
                         next_tockens: int = 2147483647, inner_precise: int = 0, prefix=None, actual_seq_qlen=None,
                         actual_seq_kvlen=None, sparse_mode: int = 0, gen_mask_parallel: bool = True,
                         sync: bool = False, softmax_layout: str = "", sink=None, dropout_mask=None, seed: int = 0,
                         offset: int = 0):
    """Flash attention forward: (attention_out, softmax_max, softmax_sum, softmax_out, seed, offset, numels)."""
    _check(head_num > 0, lambda: f"head_num must > 0, but got {head_num}")
    _check(softmax_layout in ("TND", ""), "only supported softmax_layout=TND")
    _check(not (softmax_layout == "TND" and input_layout != "TND"),
           "softmax_layout=TND only supported when input_layout_str=TND")
    layout = _check_common(query, key, value, input_layout, keep_prob, sparse_mode)
    if dropout_mask is not None:
        raise _unsupported(_FA, "a caller-supplied dropout_mask")
    if pse is not None and layout == "TND":
        raise _unsupported(_FA, "pse with the TND layout")
    batches = _Batches(query, key, value, head_num, layout, actual_seq_qlen, actual_seq_kvlen)
    numels = _numels(layout, query, key, head_num, batches)
    seed = offset = 0
    if keep_prob < 1:
        seed = torch.default_generator.initial_seed() % (2 ** 63)
        offset = int(torch.randint(0, 2 ** 31 - 1, (), dtype=torch.int64)) * 4
    drop = _DropMask(keep_prob, seed, offset)
    outs, maxes, sums = [], [], []
    for b in range(len(batches)):
        q, k, v = batches.q[b], batches.k[b], batches.v[b]
        s = _scores(q, k, batches.group, scale, _pse_piece(pse, b, q.size(1), k.size(1)),
                    _mask(atten_mask, sparse_mode, b, len(batches), q.size(1), k.size(1), pre_tockens,
                          next_tockens, prefix))
        row_max, row_sum, probs, _ = _softmax_rows(s, sink)
        keep = drop.next(probs.shape)
        if keep is not None:
            probs = probs * keep
        outs.append(probs @ v.repeat_interleave(batches.group, dim=0))
        maxes.append(row_max)
        sums.append(row_sum)
    attention = batches.assemble(outs, query.dtype)
    softmax_out = torch.empty(0, dtype=query.dtype)
    return (attention, batches.statistic(maxes, softmax_layout), batches.statistic(sums, softmax_layout),
            softmax_out, seed, offset, numels)


def npu_fusion_attention_grad(query, key, value, dy, head_num: int, input_layout: str, *, pse=None,
                              padding_mask=None, atten_mask=None, softmax_max=None, softmax_sum=None,
                              softmax_in=None, attention_in=None, scale_value: float = 1.0, keep_prob: float = 1.0,
                              pre_tockens: int = 2147483647, next_tockens: int = 2147483647,
                              inner_precise: int = 0, seed: int = 0, offset: int = 0, numels: int = 0, prefix=None,
                              actual_seq_qlen=None, actual_seq_kvlen=None, sparse_mode: int = 0,
                              gen_mask_parallel: bool = True, sync: bool = False, softmax_layout: str = "",
                              sink=None):
    """Flash attention backward: (dq, dk, dv, dpse, dsink).

    The probabilities come from softmax_max/softmax_sum when given (as the kernel reads them), else
    from the scores; ``D = rowsum(dy * attention_in)`` likewise.  dpse is None without pse, dsink
    the empty float32 tensor without sink.
    """
    layout = _check_common(query, key, value, input_layout, keep_prob, sparse_mode,
                           tensors=("query", "key", "value", "dy"), extra=dy)
    if pse is not None and layout == "TND":
        raise _unsupported("npu_fusion_attention_grad", "pse with the TND layout")
    batches = _Batches(query, key, value, head_num, layout, actual_seq_qlen, actual_seq_kvlen)
    grads = _Batches(dy, dy, dy, head_num, layout, actual_seq_qlen, actual_seq_qlen)
    outs = None if attention_in is None else _Batches(attention_in, attention_in, attention_in, head_num, layout,
                                                      actual_seq_qlen, actual_seq_qlen)
    drop = _DropMask(keep_prob, seed, offset)
    group = batches.group
    dqs, dks, dvs, dpses = [], [], [], []
    dsink = None if sink is None else torch.zeros(sink.shape, dtype=torch.float32)
    for b in range(len(batches)):
        q, k, v, do = batches.q[b], batches.k[b], batches.v[b], grads.q[b]
        pse_b = _pse_piece(pse, b, q.size(1), k.size(1))
        s = _scores(q, k, group, scale_value, pse_b,
                    _mask(atten_mask, sparse_mode, b, len(batches), q.size(1), k.size(1), pre_tockens,
                          next_tockens, prefix))
        row_max, row_sum, probs, sink_probs = _softmax_rows(s, sink)
        if softmax_max is not None and softmax_sum is not None:
            row_max = batches.read_statistic(softmax_max, b, softmax_layout)
            row_sum = batches.read_statistic(softmax_sum, b, softmax_layout)
            dead = torch.isneginf(row_max) | (row_sum == 0)
            safe_max = torch.where(dead, torch.zeros_like(row_max), row_max)
            safe_sum = torch.where(dead, torch.ones_like(row_sum), row_sum)
            probs = torch.where(dead.unsqueeze(-1), 0.0, torch.exp(s - safe_max.unsqueeze(-1)) / safe_sum.unsqueeze(-1))
            if sink is not None:
                sink_logit = sink.float().reshape(-1, 1) * torch.ones_like(row_max)
                sink_probs = torch.where(dead, 0.0, torch.exp(sink_logit - safe_max) / safe_sum).unsqueeze(-1)
        keep = drop.next(probs.shape)
        dropped = probs if keep is None else probs * keep
        v_full = v.repeat_interleave(group, dim=0)
        out = dropped @ v_full if outs is None else outs.q[b]
        d_row = (do * out).sum(dim=-1, keepdim=True)
        dp = do @ v_full.transpose(-1, -2)
        if keep is not None:
            dp = dp * keep
        ds = probs * (dp - d_row)          # d loss / d (scaled, masked scores)
        dv = (dropped.transpose(-1, -2) @ do).unflatten(0, (-1, group)).sum(dim=1)
        dq = scale_value * (ds @ k.repeat_interleave(group, dim=0))
        dk = (scale_value * (ds.transpose(-1, -2) @ q)).unflatten(0, (-1, group)).sum(dim=1)
        dqs.append(dq)
        dks.append(dk)
        dvs.append(dv)
        if pse is not None:
            dpses.append(scale_value * ds)
        if dsink is not None:
            dsink += (-(sink_probs * d_row)).sum(dim=(1, 2)).reshape(dsink.shape)
    dq = batches.assemble(dqs, query.dtype)
    dk, dv = batches.assemble(dks, query.dtype, kv=True), batches.assemble(dvs, query.dtype, kv=True)
    dpse = None
    if pse is not None:
        full = torch.stack(dpses)                                # (B, N, Sq, Skv)
        dims = [d for d in range(4) if pse.size(d) == 1 and full.size(d) != 1]
        dpse = (full.sum(dim=dims, keepdim=True) if dims else full).to(pse.dtype)
    if dsink is None:
        dsink = torch.empty(0, dtype=torch.float32)
    return dq, dk, dv, dpse, dsink


# ----------------------------------------------------------------------------- meta (shapes only)
def _fa_meta(query, key, value, head_num, input_layout, pse=None, padding_mask=None, atten_mask=None, scale=1.0,
             keep_prob=1.0, pre_tockens=2147483647, next_tockens=2147483647, inner_precise=0, prefix=None,
             actual_seq_qlen=None, actual_seq_kvlen=None, sparse_mode=0, gen_mask_parallel=True, sync=False,
             softmax_layout="", sink=None, dropout_mask=None, seed=0, offset=0):
    """torch_npu's meta kernel: shapes from the layout; seed, offset and numels are 0 when traced."""
    b, s1 = query.size(0), (query.size(2) if query.dim() > 2 else 0)
    if input_layout in ("BSH", "BSND"):
        s1 = query.size(1)
    if input_layout == "SBH":
        b, s1 = query.size(1), query.size(0)
    if input_layout in ("BSH", "SBH"):
        d = query.size(2) // head_num
        d2 = 0 if d == 0 or key.size(2) == 0 else value.size(2) // (key.size(2) // d)
        shape = [b, s1, head_num * d2] if input_layout == "BSH" else [s1, b, head_num * d2]
    elif input_layout == "BNSD":
        shape = [b, head_num, s1, value.size(3)]
    elif input_layout == "BSND":
        shape = [b, s1, head_num, value.size(3)]
    elif input_layout == "TND":
        shape = [query.size(0), head_num, value.size(2)]
    else:
        shape = list(query.shape)
    stat = [b, head_num, 8] if input_layout == "TND" else [b, head_num, s1, 8]
    return (query.new_empty(shape), query.new_empty(stat, dtype=torch.float32),
            query.new_empty(stat, dtype=torch.float32), query.new_empty([0]), 0, 0, 0)


def _fa_grad_meta(query, key, value, dy, head_num, input_layout, *, pse=None, sink=None, **_):
    dsink = query.new_empty([0], dtype=torch.float32) if sink is None else sink.new_empty(sink.shape)
    return (query.new_empty(query.shape), key.new_empty(key.shape, dtype=query.dtype),
            value.new_empty(value.shape, dtype=query.dtype),
            None if pse is None else pse.new_empty(pse.shape), dsink)


SPECS = [
    OpSpec("npu_fusion_attention(Tensor query, Tensor key, Tensor value, int head_num, str input_layout, "
           "Tensor? pse=None, Tensor? padding_mask=None, Tensor? atten_mask=None, float scale=1., "
           "float keep_prob=1., int pre_tockens=2147483647, int next_tockens=2147483647, int inner_precise=0, "
           "int[]? prefix=None, int[]? actual_seq_qlen=None, int[]? actual_seq_kvlen=None, int sparse_mode=0, "
           "bool gen_mask_parallel=True, bool sync=False, str softmax_layout=\"\", Tensor? sink=None, "
           "Tensor? dropout_mask=None, int seed=0, int offset=0) -> (Tensor, Tensor, Tensor, Tensor, int, int, int)",
           npu_fusion_attention, mix(), meta=_fa_meta),
    OpSpec("npu_fusion_attention_grad(Tensor query, Tensor key, Tensor value, Tensor dy, int head_num, "
           "str input_layout, *, Tensor? pse=None, Tensor? padding_mask=None, Tensor? atten_mask=None, "
           "Tensor? softmax_max=None, Tensor? softmax_sum=None, Tensor? softmax_in=None, "
           "Tensor? attention_in=None, float scale_value=1., float keep_prob=1., int pre_tockens=2147483647, "
           "int next_tockens=2147483647, int inner_precise=0, int seed=0, int offset=0, int numels=0, "
           "int[]? prefix=None, int[]? actual_seq_qlen=None, int[]? actual_seq_kvlen=None, int sparse_mode=0, "
           "bool gen_mask_parallel=True, bool sync=False, str softmax_layout=\"\", Tensor? sink=None) "
           "-> (Tensor, Tensor, Tensor, Tensor, Tensor)",
           npu_fusion_attention_grad, mix(), meta=_fa_grad_meta),
]
