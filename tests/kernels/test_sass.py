"""sgjit.kernels.sass: reading cuobjdump's SASS listing (no GPU, no tools for the parsing tests), and
one instantiation end to end where nvcc and cuobjdump are installed."""

from __future__ import annotations

import pytest

from sgjit.kernels import sass

# The shape of `cuobjdump -sass` output: a function header, then one instruction a line with its
# address in a comment and its encoding on the line after.
LISTING = """
	code for sm_90a
		Function : _Z6kernelPf
	.headerflags	@"EF_CUDA_TEXMODE_UNIFIED"
        /*0000*/                   LDC R1, c[0x0][0x28] ;                      /* 0x00000a00ff017b82 */
                                                                               /* 0x000fe20000000800 */
        /*0010*/                   S2R R0, SR_TID.X ;                          /* 0x0000000000007919 */
                                                                               /* 0x000e220000002100 */
        /*0020*/                   FFMA R2, R2, R3, R4 ;                       /* 0x0000000302027223 */
        /*0030*/                   MUFU.EX2 R2, R2 ;                           /* 0x0000000200027308 */
        /*0040*/               @P1 FSEL R5, R5, -INF , !P2 ;                   /* 0x0000000200027308 */
        /*0050*/                   HGMMA.64x128x16.F32.BF16 R88, gdesc[UR16], R88, gsb0 ; /* 0x01 */
        /*0060*/              @!P0 BRA 0x20 ;                                  /* 0xfffffffc00f08947 */
        /*0070*/                   BRA 0x10 ;                                  /* 0xffffff2000107947 */
        /*0080*/                   EXIT ;                                      /* 0x000000000000794d */
		Function : _Z5otherv
        /*0000*/                   NOP ;                                       /* 0x0000000000007918 */
"""


def test_parse_counts_opcodes_without_modifiers_by_kernel():
    kernels = sass.parse(LISTING)
    assert list(kernels) == ["_Z6kernelPf", "_Z5otherv"]
    k = kernels["_Z6kernelPf"]
    assert [i.address for i in k] == [0x0, 0x10, 0x20, 0x30, 0x40, 0x50, 0x60, 0x70, 0x80]
    counts = sass.opcode_counts(k)
    assert counts["MUFU"] == 1 and counts["HGMMA"] == 1 and counts["BRA"] == 2
    assert k[4].text == "@P1 FSEL R5, R5, -INF , !P2"  # the predicate is kept in the text, not the opcode
    assert [i.opcode for i in kernels["_Z5otherv"]] == ["NOP"]


def test_largest_loop_is_the_span_of_a_conditional_backward_branch():
    k = sass.parse(LISTING)["_Z6kernelPf"]
    loop = sass.largest_loop(k)
    # @!P0 BRA 0x20 closes 0x20..0x60; the unconditional BRA 0x10 (an out-of-line jump back) is not a loop
    assert [i.address for i in loop] == [0x20, 0x30, 0x40, 0x50, 0x60]
    assert sass.largest_loop(sass.parse(LISTING)["_Z5otherv"]) == []
    text = sass.report(LISTING, top=3)
    assert "_Z6kernelPf: 9 instructions; largest loop 5" in text


NESTED = """
		Function : _Z4walkv
        /*0000*/                   S2R R0, SR_TID.X ;
        /*0010*/                   R2UR UR8, R4 ;
        /*0020*/                   HGMMA.64x128x16.F32.BF16 R88, gdesc[UR8], RZ, !UPT, gsb0 ;
        /*0030*/                   WARPGROUP.DEPBAR.LE gsb0, 0x0 ;
        /*0040*/                   UIADD3 UR4, UR4, 0x1, URZ ;
        /*0050*/                   STL [R1], R2 ;
        /*0060*/               @P0 BRA 0x10 ;
        /*0070*/                   LDL R2, [R1] ;
        /*0080*/              @!P1 BRA 0x0 ;
        /*0090*/                   EXIT ;
"""


def test_every_loop_is_listed_with_its_mma_uniform_and_spill_counts():
    k = sass.parse(NESTED)["_Z4walkv"]
    inner, outer = sass.loops(k)  # in the order of their closing branches
    assert [len(inner), len(outer)] == [6, 9]
    assert sass.largest_loop(k) == outer
    assert sass.loop_counts(inner) == {"HGMMA": 1, "R2UR": 1, "UIADD3": 1, "DEPBAR": 1, "LDL": 0, "STL": 1}
    assert sass.loop_counts(outer)["LDL"] == 1
    text = sass.report(NESTED, top=2, all_loops=True)
    assert "loop 0x0010-0x0060: 6 instructions; HGMMA 1, R2UR 1, UIADD3 1, DEPBAR 1, LDL 0, STL 1" in text
    assert "loop 0x" not in sass.report(NESTED, top=2)


@pytest.mark.skipif(
    sass.find_nvcc() is None or sass.find_cuobjdump() is None, reason="needs nvcc and cuobjdump"
)
def test_one_instantiation_end_to_end():
    """The SiLU-mul kernel for sm_80: it has instructions, and the report names it."""
    from sgjit.kernels.cuda.activation import silu_mul_name

    name = silu_mul_name("bfloat16")
    listing = sass.disassemble("activation", name, "sm_80")
    kernels = sass.parse(listing)
    assert len(kernels) == 1 and len(next(iter(kernels.values()))) > 10
    assert "instructions; largest loop" in sass.report(listing)
