"""The GPU catalog: what `cluster.gpu` names, as data (dense peaks, no sparsity).

Figures are the vendors' published ones: NVIDIA's H100 and H200 Tensor Core GPU datasheets (SXM),
the H800 as sold in China (the H100's compute and memory with NVLink cut to 400 GB/s, 200 one way,
as the A800's below), NVIDIA's DGX B200, GB200 NVL72, DGX B300 and GB300 NVL72 product pages, and AMD's
Instinct MI300X, MI325X and MI355X data sheets; the Ampere and China-market cards are cited where
they are listed. NVLink is per
GPU and one direction; scale-out is the GPU's own network adapter (400 Gb/s = 50 GB/s, 800 Gb/s =
100 GB/s on Blackwell Ultra). `memory_gib` is the datasheet's GB figure read as GiB, as moeplan's
default of 80 always was; override `cluster.gpu_memory_gib` for what your driver reports.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from fractions import Fraction
from types import MappingProxyType
from typing import Any


@dataclass(frozen=True)
class Gpu:
    """One GPU model: peaks, memory, links and how many GPUs share an NVLink domain."""

    name: str
    bf16_tflops: float
    # None: the card has no FP8 tensor cores (Ampere); Transformer Engine refuses FP8 on it
    # (transformer_engine/pytorch/fp8.py check_fp8_support: compute capability 8.9 or higher).
    fp8_tflops: float | None
    memory_gib: float
    hbm_tb_s: float
    # Per GPU, one direction, between the GPUs of a node: NVLink through NVSwitch, or the card's own
    # PCIe link where no switch joins the node's GPUs (nvlink_bridge below).
    nvlink_gb_s: float
    scale_out_gb_s: float  # per GPU, one direction
    nvlink_domain: int  # GPUs that reach each other over NVLink
    gpus_per_node: int  # GPUs in one node (tray) of a standard system
    # GEMM dimension at which a GEMM reaches half its large-shape efficiency (the step-time model's
    # shape curve, planner/budget/time.py): bigger chips need bigger tiles in flight to fill.
    gemm_half_dim: float = 64.0
    # Share of the dense FP8 peak large FP8 GEMMs reach in training (casts and scaling included):
    # fitted per family on the calibration figures (docs/estimate.md); unset efficiency.gemm_fp8
    # takes it.
    gemm_fp8_eff: float = 0.5
    # The same for BF16 GEMMs (unset efficiency.gemm_bf16 takes it); fitted per family alike.
    gemm_bf16_eff: float = 0.8
    # Architecture family: calibration factors may be fitted per family (`gemm_fp8@blackwell`).
    family: str = ""
    # The names a log gives the card (torch.cuda.get_device_name / nvidia-smi, after "NVIDIA "),
    # matched as whole words; unset: the catalog name itself. A name that does not fix the card
    # (a bare "A100": 40 or 80 GB) is none of them, so a log that gives only it names no card.
    device_names: tuple[str, ...] = ()
    # The CPU family of the host that issues this card's kernels (HOSTS): Grace on the NVL72 trays,
    # x86 on HGX/DGX boards and AMD's platforms.
    host: str = "x86"
    # PCIe cards joined only by NVLink bridges: how many GPUs one bridge joins (2 or 4; 0: none, or an
    # NVSwitch domain) and its bandwidth per GPU, one direction. The cluster prices every intra-node
    # collective at one bandwidth (cluster.intra_node_bandwidth_gb_s), so such a card's node is priced
    # at its PCIe link and CLU007 says the bridge is not modelled.
    nvlink_bridge: int = 0
    bridge_gb_s: float = 0.0
    # The card's link to its host CPU, GB/s one direction (what activation offloading and the
    # weight-hash check copy over): PCIe Gen5 x16 on Hopper, Blackwell and AMD's CDNA 3/4 boards
    # (NVIDIA H100 datasheet: "PCIe Gen5 128 GB/s"; AMD Instinct MI300X data sheet: PCIe Gen5 x16,
    # 128 GB/s, both directions), Gen4 x16 on Ampere and Ada (NVIDIA A100 datasheet: "PCIe Gen4
    # 64 GB/s"), NVLink-C2C to a Grace host (NVIDIA GB200 NVL72 / GH200 datasheets: 900 GB/s).
    host_link_gb_s: float = 64.0
    # Share of nvlink_gb_s the link's own protocol leaves usable, before any collective's
    # efficiency (efficiency.intra_node) applies. NVLink: 1, its overhead is inside intra_node, which
    # was calibrated on NVLink runs. AMD's Infinity Fabric (xGMI): CRC bit correction and protocol
    # overhead leave about 48 of a link's 64 GB/s usable on MI300X, 75 % (ROCm blog "Understanding
    # RCCL Bandwidth and xGMI Performance on AMD Instinct MI300X", 2025-03-02, "Theoretical
    # Performance Claims vs. Achievable"); MI325X and MI355X run the same xGMI mesh of seven links
    # and take the same share (AMD states it for MI300X only). Added after the held-out AMD rows
    # (bench/heldout.yaml, amd-primus-moe-blog) had shown their all-to-all layouts too fast; a cited
    # figure, not fitted to them.
    link_usable_share: float = 1.0
    # Share of the dense BF16 peak core (flash) attention reaches over its forward and backward
    # (efficiency.attention where unset; moeplan prices the backward as two forwards, Megatron's
    # 3x). 0.5: the catalog default every NVIDIA card keeps; a card with a published measurement of
    # its vendor's attention kernels takes that (AMD_ATTENTION below).
    attention_eff: float = 0.5

    @property
    def log_names(self) -> tuple[str, ...]:
        """What a log calls this card."""
        return self.device_names or (self.name,)


# xGMI's usable share of its link rate: 48 of 64 GB/s (Gpu.link_usable_share).
XGMI_USABLE_SHARE = 48 / 64

# MI355X measured on its own libraries (HazyResearch/HipKittens @f09e9685, the baselines of the
# HipKittens paper, ROCm 7.0 on MI355X): hipBLASLt's square BF16 and FP8 GEMMs at M = N = K = 1,024
# to 16,384 (analysis/bf16_gemm/plot.py mi355x_baselines["hipblaslt"];
# analysis/fp8_gemm/mi350x/mi355x_fp8_gemm.json "tflops_hipblaslt"; FP8 at 8,192, 3,233 TFLOP/s,
# agrees with AMD's own ~3,130 in ROCm blog "FP8 GEMM Optimization on AMD CDNA4 Architecture"),
# and AITER's flash attention, causal, 16 x 16 heads of 128 at 4,096 tokens
# (analysis/attn/fwd/benchmark/mi355x_mha_causal_fwd.json and
# analysis/attn/bkwd/benchmark/mi355x_mha_bkwd_causal.json, "tflops_ref"): forward 1,069.0
# TFLOP/s on the causal half of 4·s²·h·d, backward (AITER's assembly kernel, which ROCm
# Transformer Engine's NVTE_CK_USES_BWD_V3=1 selects) 876.8 TFLOP/s on 2.5x that count.
MI355X_HIPBLASLT_BF16_TFLOPS: MappingProxyType[int, float] = MappingProxyType({
    1024: 167.903, 2048: 639.608, 4096: 1432.70, 8192: 1574.69, 16384: 1579.20})
MI355X_HIPBLASLT_FP8_TFLOPS: MappingProxyType[int, float] = MappingProxyType({
    1024: 204.913, 2048: 1172.69, 4096: 2748.78, 8192: 3233.19, 16384: 3293.23})
# The step-time model's GEMM shape curve (planner/budget/time.py _dim_eff: each dimension d at
# d / (d + gemm_half_dim) of the large-shape share) with MI355X's parameters least-squares fitted
# (in log rate, one half-dimension for both precisions, one large-shape rate each) to those ten
# hipBLASLt points, each point's time less the fixed GPU cost moeplan prices per kernel apart
# (efficiency.gpu_us_per_kernel, 7 us): half-dimension 792, large-shape rates 2,168 BF16 and 4,505
# FP8 TFLOP/s (tests/unit/budget/test_mi355x_gemm_curve.py re-derives them; the curve's rms error
# over the points is 17 %, the d / (d + h) form saturating more slowly than the card, which reaches
# 90 % of its 8,192 rate at 4,096 and 40 % at 2,048). A 256-CU chip needs far more tiles in
# flight than the catalog's half-dimension of 64 says: a routed expert of DeepSeek-V2 (about 1,200
# rows at EP 8) is priced at 0.46 of the 8,192-cube rate, between the measured 2,048 and 4,096
# cubes. For comparison on the sibling card, a fused kernel: Primus-Turbo's MI300X grouped-GEMM
# baseline (AMD-AGI/Primus-Turbo @23e36d65 benchmark/baselines/grouped_gemm.json) runs
# DeepSeek-V2's 20-expert gate/up GEMM at 1,024 rows an expert at 443 TFLOP/s, 0.63 of MI300X's
# max-achievable 708; Megatron's legacy grouped GEMM, a per-expert hipBLAS loop over streams,
# runs DeepSeek shapes up to 1.9x slower forward than that kernel (AMD's "MoE Training Best
# Practices on AMD GPUs", Figure 1, measured on MI325X). Added after the held-out AMD rows had
# been seen (their MBS sweep of DeepSeek-V2-Lite runs 1.16-1.18x too fast with a half-dimension
# of 64); the parameters come from the microbenchmark alone, none from those rows.
MI355X_GEMM_HALF_DIM = 792.0
MI355X_BF16_GEMM_TFLOPS, MI355X_FP8_GEMM_TFLOPS = 2168.0, 4505.0
MI355X_ATTENTION_FWD_TFLOPS, MI355X_ATTENTION_BWD_TFLOPS = 1069.0, 876.8


def measured_attention_share(peak_tflops: float, fwd_tflops: float, bwd_tflops: float) -> float:
    """The attention share (Gpu.attention_eff) a measured forward and backward rate give: moeplan
    prices forward + backward as 3 forwards at peak x share, the measurement took one forward at
    fwd_tflops and a backward of 2.5 forwards' FLOPs at bwd_tflops, so share = 3 / (peak x (1 / fwd
    + 2.5 / bwd))."""
    return 3 / (peak_tflops * (1 / fwd_tflops + 2.5 / bwd_tflops))

# The GEMM shares fitted per GPU family on bench/heldout.py's calibration figures (its
# --fit-defaults: gemm_bf16@hopper, gemm_fp8@blackwell, ...): every card of the family takes them,
# so a refit is one line here.
HOPPER: dict[str, Any] = {"gemm_fp8_eff": 0.502, "gemm_bf16_eff": 0.665, "family": "hopper"}
BLACKWELL: dict[str, Any] = {"gemm_fp8_eff": 0.455, "gemm_bf16_eff": 0.462, "family": "blackwell"}

GPUS: MappingProxyType[str, Gpu] = MappingProxyType({gpu.name: gpu for gpu in (
    Gpu("H100", 989, 1979, 80, 3.35, 450, 50, 8, 8, **HOPPER),
    Gpu("H200", 989, 1979, 141, 4.8, 450, 50, 8, 8, **HOPPER),
    # The H800's NVLink is its line rate, 400 GB/s both ways (NVIDIA H800 Tensor Core GPU datasheet,
    # SXM), like every other card here: efficiency.intra_node (0.85) is the share a collective
    # reaches of a line rate (NVIDIA/nccl-tests issue #212, the NCCL maintainer: "450GB/s is the
    # line rate. With the protocol overhead (~20%) NCCL can get an effective NVLink bandwidth of
    # 370GB/s"). DeepSeek's "about 160 GB/s" (DeepSeek-V3 technical report; deepseek-ai/DeepEP
    # docs/legacy.md "H800 (~160 GB/s NVLink maximum bandwidth)", its intranode dispatch and combine
    # measured at 153 and 158 GB/s) is already that achieved figure: 200 x 0.85 = 170 GB/s agrees
    # with it, where 160 here took the protocol's share off twice (136 GB/s). Changed after the
    # held-out H800 rows (bench/heldout.yaml, user-logs) had shown them too slow; the datasheet's
    # figure, not fitted to them.
    Gpu("H800", 989, 1979, 80, 3.35, 200, 50, 8, 8, **HOPPER),
    # H20, the China-market Hopper, as NVIDIA's HGX H20 specification lists it (no public
    # datasheet): 148 dense BF16 TFLOP/s and 296 dense FP8, 96 GB HBM3 at 4.0 TB/s, NVLink 4 at
    # 900 GB/s (450 one way) in 8-GPU HGX boards; one 400 Gb/s NIC per GPU as on HGX H100. Its
    # GEMM shares are the Hopper ones fitted on H100 runs: no H20 run is calibrated on.
    Gpu("H20", 148, 296, 96, 4.0, 450, 50, 8, 8, **HOPPER),
    Gpu("B200", 2250, 4500, 180, 8, 900, 50, 8, 8, **BLACKWELL),
    Gpu("GB200", 2500, 5000, 186, 8, 900, 50, 72, 4, **BLACKWELL, host="grace", host_link_gb_s=450),
    Gpu("B300", 2250, 4500, 288, 8, 900, 100, 8, 8, **BLACKWELL),
    Gpu("GB300", 2500, 5000, 288, 8, 900, 100, 72, 4, **BLACKWELL, host="grace", host_link_gb_s=450),
    # Ampere (NVIDIA A100 Tensor Core GPU datasheet, SXM: 312 dense BF16 TFLOP/s, no FP8; 40 GB HBM2
    # at 1,555 GB/s or 80 GB HBM2e at 2,039 GB/s; NVLink 3 at 600 GB/s, 300 one way; DGX A100 and
    # HGX A100 8-GPU boards with one 200 Gb/s HDR adapter per GPU, 25 GB/s). The A800 is the
    # China-market A100 80 GB with NVLink cut to 400 GB/s (200 one way; NVIDIA's A800 Tensor Core
    # GPU datasheet, SXM4 80 GB), the same compute and memory. No Ampere run is calibrated on:
    # the catalog's default GEMM shares stand.
    Gpu("A100-40GB", 312, None, 40, 1.555, 300, 25, 8, 8, family="ampere",
        device_names=("A100-SXM4-40GB",), host_link_gb_s=32),
    Gpu("A100-80GB", 312, None, 80, 2.039, 300, 25, 8, 8, family="ampere",
        device_names=("A100-SXM4-80GB",), host_link_gb_s=32),
    Gpu("A800", 312, None, 80, 2.039, 200, 25, 8, 8, family="ampere",
        device_names=("A800-SXM4-80GB",), host_link_gb_s=32),
    # Hopper PCIe boards (NVIDIA H100 Tensor Core GPU datasheet, PCIe and NVL columns; NVIDIA H200
    # NVL product page): dense rates are the datasheet's sparsity figures halved (H100 PCIe 1,513 /
    # 3,026 BF16/FP8 TFLOP/s with sparsity; H100 NVL and H200 NVL 1,671 / 3,341); 80 GB HBM2e at
    # 2.0 TB/s, 94 GB HBM3 at 3.9 TB/s, 141 GB HBM3e at 4.8 TB/s. No NVSwitch: a node's GPUs meet
    # over PCIe Gen5 x16 (128 GB/s both ways, 64 one way); NVLink bridges join pairs (H100 PCIe and
    # NVL: 600 GB/s, 300 one way) or up to four (H200 NVL's 2- or 4-way bridge: 900 GB/s, 450 one
    # way). Eight cards a server, one 400 Gb/s NIC each as on HGX H100; the SXM cards' GEMM shares.
    Gpu("H100-PCIe", 756.5, 1513, 80, 2.0, 64, 50, 8, 8, **HOPPER,
        device_names=("H100 PCIe",), nvlink_bridge=2, bridge_gb_s=300),
    Gpu("H100-NVL", 835.5, 1670.5, 94, 3.9, 64, 50, 8, 8, **HOPPER,
        device_names=("H100 NVL",), nvlink_bridge=2, bridge_gb_s=300),
    Gpu("H200-NVL", 835.5, 1670.5, 141, 4.8, 64, 50, 8, 8, **HOPPER,
        device_names=("H200 NVL",), nvlink_bridge=4, bridge_gb_s=450),
    # Grace Hopper (NVIDIA GH200 Grace Hopper Superchip datasheet): the H100's dense rates (989 /
    # 1,979 TFLOP/s), 96 GB HBM3 at 4.0 TB/s (CUDA's "GH200 480GB": 480 GB of LPDDR5X beside it) or
    # 144 GB HBM3e at 4.9 TB/s ("GH200 144G HBM3e"); NVLink 4 at 900 GB/s (450 one way) between
    # superchips, one 400 Gb/s adapter each. One superchip a node (NVIDIA MGX); a node of several
    # sets cluster.gpus_per_node, and intra_node_bandwidth_gb_s where its NVLink links are split
    # between peers. A bare "GH200" in a log fixes neither memory, so names no card.
    Gpu("GH200", 989, 1979, 96, 4.0, 450, 50, 1, 1, **HOPPER,
        host="grace", device_names=("GH200 480GB",), host_link_gb_s=450),
    Gpu("GH200-144GB", 989, 1979, 144, 4.9, 450, 50, 1, 1, **HOPPER,
        host="grace", device_names=("GH200 144G HBM3e",), host_link_gb_s=450),
    # L20, the China-market Ada card (NVIDIA L20 product specification: 119.5 BF16 and 239 FP8
    # tensor TFLOP/s, 48 GB GDDR6 at 864 GB/s, PCIe Gen4 x16 at 64 GB/s both ways, 32 one way, no
    # NVLink); eight a server, one 200 Gb/s adapter each as on the PCIe Gen4 Ampere boards. No Ada
    # run is calibrated on: the catalog's default GEMM shares stand. Matched only as CUDA names it
    # ("NVIDIA L20"): a bare "L20" in a log is too common a word.
    Gpu("L20", 119.5, 239, 48, 0.864, 32, 25, 8, 8, family="ada", device_names=("NVIDIA L20",),
        host_link_gb_s=32),
    # AMD Instinct (AMD's MI300X, MI325X and MI355X product pages and data sheets: dense BF16 and
    # FP8 without sparsity; Infinity Fabric's aggregate peer bandwidth of its seven links, quoted
    # bidirectional, halved for one direction; eight GPUs per platform, one 400 Gb/s NIC each).
    # No published AMD run is fitted on (bench/heldout.yaml's AMD family is held out), so their
    # GEMM shares are AMD's own measured GEMM rates over the dense peak: the Max-Achievable FLOPs of
    # hipBLASLt on its best shape (ROCm blog "Measuring Max-Achievable FLOPs - Part 2", 2025-02-28,
    # Table 1: MI300X 708 BF16 / 1,273 FP8 TFLOP/s, MI325X 843 / 1,519), and for MI355X's FP8
    # hipBLASLt at M = N = K = 8192, about 3,130 TFLOP/s (ROCm blog "FP8 GEMM Optimization on AMD
    # CDNA4 Architecture", 2026-03-10). MI355X's GEMM shares and shape curve are hipBLASLt's rates
    # measured on MI355X itself from 1,024 to 16,384 (MI355X_GEMM_HALF_DIM and the large-shape
    # rates above: BF16 share 0.861 and FP8 0.895 of the dense peaks, at half-dimension 792). They
    # replaced the 8,192 point alone at the catalog's half-dimension (BF16 0.626), which had
    # replaced a derivation (AMD's MI355X FP8 share times CDNA3's BF16-over-FP8 share: 0.691), which
    # had replaced the catalog default (0.8) after the held-out AMD rows had shown that default
    # 1.3-1.5x too fast; each replacement came after those rows had been seen, each a cited
    # measurement, none fitted to them. MI355X's attention share is
    # AITER's measured forward and backward (MI355X_ATTENTION_*: 0.315 of the BF16 peak, where the
    # catalog default is 0.5), added after the same rows had been seen.
    Gpu("MI300X", 1307.4, 2614.9, 192, 5.3, 448, 50, 8, 8, gemm_bf16_eff=708 / 1307.4,
        gemm_fp8_eff=1273 / 2614.9, family="cdna3", link_usable_share=XGMI_USABLE_SHARE),
    Gpu("MI325X", 1307.4, 2614.9, 256, 6.0, 448, 50, 8, 8, gemm_bf16_eff=843 / 1307.4,
        gemm_fp8_eff=1519 / 2614.9, family="cdna3", link_usable_share=XGMI_USABLE_SHARE),
    Gpu("MI355X", 2516.6, 5033.2, 288, 8.0, 537.6, 50, 8, 8,
        gemm_bf16_eff=MI355X_BF16_GEMM_TFLOPS / 2516.6, gemm_fp8_eff=MI355X_FP8_GEMM_TFLOPS / 5033.2,
        gemm_half_dim=MI355X_GEMM_HALF_DIM, family="cdna4", link_usable_share=XGMI_USABLE_SHARE,
        attention_eff=measured_attention_share(2516.6, MI355X_ATTENTION_FWD_TFLOPS,
                                               MI355X_ATTENTION_BWD_TFLOPS)),
)})


@dataclass(frozen=True)
class Host:
    """A host CPU family: how long one of its cores takes to issue a PyTorch op (Python, PyTorch's
    dispatcher and the CUDA launch). Every kernel Megatron launches outside a CUDA graph waits for
    that core, so the step-time model's host time per kernel (efficiency.host_us_per_launch,
    calibrated for the reference host) is scaled by `launch_scale` (efficiency.host_launch_scale
    when unset) on a NUMA-bound rank; an unbound one pays the measured bare op's extra time on top
    (planner/budget/hardware.py unbound_launch_s)."""

    name: str
    cpu: str  # the CPU the published figure was measured on
    linear_forward_us: float  # host µs of one torch.nn.Linear forward, measured
    # The scale the step-time model uses for a rank bound to its GPU's NUMA node: fitted on the
    # calibration figures of this host (bench/heldout.py FITTED host_launch_scale@grace).
    launch_scale: float = 1.0
    # A rank not bound to its GPU's NUMA node: the share of the measured bare op's extra time
    # (linear_forward_us less the reference's at the bound scale) it pays per bare op, from a
    # whole-run measurement of binding (bench/grace_binding.py).
    unbound_share: float = 1.0
    # SHA-1 on one core (what the weight-hash check runs, through Python's hashlib and OpenSSL):
    # OpenSSL's own table of cycles per byte (openssl/openssl crypto/sha/asm/sha1-x86_64.pl and
    # sha1-armv8.pl headers) at the host's all-core clock. x86: the SHA-extension figure of the
    # big-core row it lists (Ryzen, 1.93; the DGX H100's Xeon 8480C has the same extensions) at the
    # Xeon 8480's all-core turbo, 3.0 GHz. Grace (Neoverse V2, Armv8 crypto extensions): the
    # Arm-designed core's hardware-assisted row (Cortex-A57, 2.35) at Grace's 3.0 GHz.
    sha1_cycles_per_byte: float = 1.93
    clock_ghz: float = 3.0

    @property
    def bare_op_s(self) -> Fraction:
        """The measured bare op (linear_forward_us) in seconds, exact as published (Grace: 37.08
        µs)."""
        return Fraction(str(self.linear_forward_us)) / 10**6


# One torch.nn.Linear forward (BF16, hidden 2,048, 8,192 tokens) timed on the host, averaged over
# many runs, on a DGX H100 and on GB200 (NVIDIA/TransformerEngine issue #2053, "[PyTorch] High CPU
# overhead on Grace systems", 2025-08-11: 13.48 µs on the Xeon, 37.08 µs on GB200's Grace, 33.17 on
# GH200's): Grace issues a bare PyTorch op 2.75x slower, which a rank pays when its process is not
# bound to its GPU's NUMA node (cluster.host_numa_binding false: the first rows of Megatron-LM's
# GB200 write-up, before its bindpcie step): per bare op it pays the measured extra, 37.08 µs less
# the Xeon's 13.48 at the bound scale, times the unbound share, on top of the bound host time. An
# absolute extra, not the ratio on the calibrated time per launch: that figure holds Megatron's
# host work around the counted launches as well (allocations, module set-up), the measurement a
# bare op alone. The share is derived by bench/grace_binding.py as the share for which moeplan
# reproduces the write-up's measured binding gain (section 2.4, bindpcie: 691.49 -> 762.12
# TFLOP/s/GPU, 1.102x, on its CUDA-graph configuration), capped at 1 (the whole measured extra).
# On the current time model no share reaches the gain: there the host issues the experts while
# the GPU runs the token exchanges, so the share is 1; the rest of the measured gain (remote-NUMA
# host memory, the dispatcher's host-side proxies) is nothing moeplan prices. Bound, as production
# launchers run, Grace's scale is fitted on the Grace calibration figures (bench/heldout.py: 0.93,
# no measurable penalty once bound and with Transformer Engine's CPU-overhead fixes). Other
# x86 server CPUs (DGX B200's Xeon 8570, AMD EPYC) take the Xeon's figure: no published per-op
# measurement separates them.
HOSTS: MappingProxyType[str, Host] = MappingProxyType({host.name: host for host in (
    Host("x86", "Intel Xeon Platinum 8480C (DGX H100)", 13.48),
    Host("grace", "NVIDIA Grace, Arm Neoverse V2 (GB200 NVL72)", 37.08, launch_scale=0.93,
         unbound_share=1.0, sha1_cycles_per_byte=2.35),
)})
# The host efficiency.host_us_per_launch is calibrated for.
REFERENCE_HOST = "x86"

# What one counted launch costs the host, by the kind of call that issues it, in bare PyTorch ops
# (the figure efficiency.host_us_per_launch calibrates): the host time of a launch is mostly the
# Python and PyTorch work of its caller, not the CUDA launch. A GEMM that is one Transformer Engine
# module call (te.Linear, LayerNormLinear, GroupedLinear: its Python set-up, prepare_forward, the
# quantizers, the workspace) costs HOST_MODULE_OP: te.Linear's forward takes 99.66 µs of host time
# against torch.nn.Linear's 37.08 on GB200's Grace and 90.53 against 33.17 on GH200's
# (NVIDIA/TransformerEngine issue #2053, BF16, hidden 2,048, 8,192 tokens), 2.69x and 2.73x; the
# Grace figure is taken. Every other counted launch (a PyTorch op, a fused kernel behind one
# autograd.Function, a launch a module issues from its own C++) costs one bare op: no published
# measurement separates them (planner/budget/time.py _host_kinds counts the module calls). Two
# further kinds were tried on the bench and left out: a grouped GEMM's per-expert launches at half
# a bare op (its C++ loop without Python), and the router's kernels at the step time the GB200
# write-up gained per kernel its router fusion removed (0.38 of a bare op with its backward):
# each made the held-out families worse (Moonlight's recompute sweep, fitted without it, from 2 to
# 17 and 50 %), so the calibrated figure still holds the host work those kernels stand beside.
HOST_MODULE_OP = Fraction(9966, 3708)
# The same call under FP8 (training.fp8, any recipe) costs HOST_MODULE_FP8 times its BF16 host
# time: besides the GEMM, Transformer Engine quantizes the input (a new quantized tensor object per
# call, built in Python), keeps the scales for the backward and updates the recipe's state, all on
# the host before the kernel launches. Measured on H100: "scheduling a te.Linear layer in FP8 takes
# more than 2x more time compared to scheduling the te.Linear layer in BF16" (NVIDIA/
# TransformerEngine issue #761, 2024-04-09, the forward's wall time 140 ms against 77 ms on a
# host-bound toy model); an older, host-bound single te.Linear timed 2.07 ms in FP8 against 0.57 ms
# in BF16 (issue #445, 2023-10-16; 2.57 against 0.89 ms on a second machine there). The most recent
# figure, the lower bound of the three, is taken. Blocks kept in BF16 under FP8
# (training.first_last_layers_bf16) pay the BF16 price; FP4 has no published host measurement and
# is priced as BF16. (Added after Megatron's CI case gpt3_moe_mcore_te_tp4_ep2_etp2_pp2_scoped_
# cudagraph, FP8 blockwise at hidden 512, was seen 2x slower than estimated, eager and graphed
# alike, and no other term of its host time differed from the BF16 cases.)
HOST_MODULE_FP8 = 2


# What a config without `cluster.gpu` gets: an H100's figures, moeplan's defaults before the catalog.
DEFAULT_GPU = "H100"


def gpu(name: str) -> Gpu:
    """The catalog entry of `name` (a resolved config's `cluster.gpu`)."""
    return GPUS[name]


# What logs call the cards (Gpu.log_names: "A100-SXM4-80GB" is the catalog's A100-80GB), longest
# first: a name that starts a longer one is tried after it. No leading `\b` in the pattern: it
# stops re from skipping to the names' first letters (64 µs a log line, now about 5);
# `card_named` checks the start of the word itself.
GPU_CARDS = MappingProxyType({log: card.name for card in GPUS.values() for log in card.log_names})
# Cards whose names start with a catalog card's but which are other cards: PCIe boards with their
# own clocks, memory and NVLink bridges of two (NVIDIA's H800 PCIe, A100 and A800 PCIe data
# sheets). A log naming one names no catalog card (never the SXM figures).
NOT_IN_CATALOG = ("H800 PCIe", "A100-PCIE-40GB", "A100 80GB PCIe", "A800 80GB PCIe",
                  "A800 40GB")
_CARD_WORD = re.compile("(" + "|".join(map(re.escape, sorted((*GPU_CARDS, *NOT_IN_CATALOG), key=len,
                                                             reverse=True))) + r")\b")
_WORD_CHAR = re.compile(r"\w")


def card_named(line: str) -> str | None:
    """The catalog card first named as a whole word in LINE ("NVIDIA H20", "NVIDIA A100-SXM4-80GB");
    a name inside a longer word, one that does not fix the card (a bare "A100") or one of a card
    the catalog lacks ("H100 PCIe": NOT_IN_CATALOG) is none."""
    for match in _CARD_WORD.finditer(line):
        start = match.start()
        if start == 0 or not _WORD_CHAR.match(line, start - 1):
            return GPU_CARDS.get(match.group(1))
    return None


def has_fp8(name: str) -> bool:
    """Whether the card runs FP8 GEMMs at all (Transformer Engine's check_fp8_support)."""
    return gpu(name).fp8_tflops is not None


def pre_hopper(name: str) -> bool:
    """Whether the card is older than compute capability 9.0 (Ampere 8.0, Ada 8.9), where PyTorch's
    and Transformer Engine's cuBLAS workspaces are smaller (planner/budget/device_memory.py)."""
    return gpu(name).family in ("ampere", "ada")


def takes_tn_only(name: str) -> bool:
    """Whether the card's FP8 GEMMs take only the TN layout, so Transformer Engine keeps a physically
    transposed copy of a tensor-scaled FP8 weight for the data-gradient GEMM: Hopper and Ada do
    (cuBLASLt's FP8 GEMMs before compute capability 10.0 take TN only), Blackwell reads either
    layout (Transformer Engine docs, low-precision training, "Performance considerations: handling
    transposes")."""
    return gpu(name).family in ("hopper", "ada")
