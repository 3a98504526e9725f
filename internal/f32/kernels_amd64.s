//go:build amd64

#include "textflag.h"

// The AVX2 loops of kernels.go (which holds their definitions in Go).
// Every loop takes 8 float32 values a turn; n is a multiple of 8. Sums of
// squares go into two float64 accumulators (the low and high four values
// of each turn, widened).

// Y14 = 0x7fffffff in every lane: the mask that clears the sign bit.
#define ABSMASK(reg) VPCMPEQD reg, reg, reg; VPSRLD $1, reg, reg

// Add the squares of the 8 float32 values of ymm d (its low half in xmm
// xd) into the float64 accumulators acc1 and acc2, using t1 and t2 (xt2).
// Loops that sum squares take 16 values a turn into four accumulators
// (Y10 to Y13): one FMA chain per accumulator a turn, so that the FMA's
// latency does not set the pace.
#define SQUARES(d, xd, t1, t2, xt2, acc1, acc2) VCVTPS2PD xd, t1; VEXTRACTF128 $1, d, xt2; VCVTPS2PD xt2, t2; VFMADD231PD t1, t1, acc1; VFMADD231PD t2, t2, acc2

#define ZERO4 VXORPD Y10, Y10, Y10; VXORPD Y11, Y11, Y11; VXORPD Y12, Y12, Y12; VXORPD Y13, Y13, Y13

// Sum the accumulators Y10 to Y13 into X12's low float64.
#define HSUM VADDPD Y11, Y10, Y10; VADDPD Y13, Y12, Y12; VADDPD Y10, Y12, Y12; VEXTRACTF128 $1, Y12, X13; VADDPD X13, X12, X12; VHADDPD X12, X12, X12

// func withinAVX2(v *float32, n int, limit uint32) bool
TEXT ·withinAVX2(SB), NOSPLIT, $0-25
	MOVQ v+0(FP), DI
	MOVQ n+8(FP), CX
	MOVL limit+16(FP), BX
	VMOVD BX, X15
	VPBROADCASTD X15, Y15
	ABSMASK(Y14)
	VPXOR Y13, Y13, Y13
	XORQ AX, AX
within_loop:
	CMPQ AX, CX
	JAE within_done
	VPAND (DI)(AX*4), Y14, Y0
	VPCMPGTD Y15, Y0, Y0
	VPOR Y0, Y13, Y13
	ADDQ $8, AX
	JMP within_loop
within_done:
	VPTEST Y13, Y13
	SETEQ ret+24(FP)
	VZEROUPPER
	RET

// func checkDistAVX2(y, r *float32, n int, limit uint32) (d2 float64, ok bool)
TEXT ·checkDistAVX2(SB), NOSPLIT, $0-41
	MOVQ y+0(FP), DI
	MOVQ r+8(FP), SI
	MOVQ n+16(FP), CX
	MOVL limit+24(FP), BX
	VMOVD BX, X15
	VPBROADCASTD X15, Y15
	ABSMASK(Y14)
	VPXOR Y9, Y9, Y9
	ZERO4
	XORQ AX, AX
	MOVQ CX, DX
	ANDQ $-16, DX
cd_loop16:
	CMPQ AX, DX
	JAE cd_tail
	VMOVUPS (DI)(AX*4), Y0
	VMOVUPS 32(DI)(AX*4), Y1
	VPAND Y14, Y0, Y2
	VPAND Y14, Y1, Y3
	VPCMPGTD Y15, Y2, Y2
	VPCMPGTD Y15, Y3, Y3
	VPOR Y2, Y9, Y9
	VPOR Y3, Y9, Y9
	VSUBPS (SI)(AX*4), Y0, Y0
	VSUBPS 32(SI)(AX*4), Y1, Y1
	SQUARES(Y0, X0, Y4, Y5, X5, Y10, Y11)
	SQUARES(Y1, X1, Y6, Y7, X7, Y12, Y13)
	ADDQ $16, AX
	JMP cd_loop16
cd_tail:
	CMPQ AX, CX
	JAE cd_done
	VMOVUPS (DI)(AX*4), Y0
	VPAND Y14, Y0, Y2
	VPCMPGTD Y15, Y2, Y2
	VPOR Y2, Y9, Y9
	VSUBPS (SI)(AX*4), Y0, Y0
	SQUARES(Y0, X0, Y4, Y5, X5, Y10, Y11)
cd_done:
	HSUM
	VMOVSD X12, d2+32(FP)
	VPTEST Y9, Y9
	SETEQ ok+40(FP)
	VZEROUPPER
	RET

// func copyDistAVX2(dst, src *float32, n int) float64
TEXT ·copyDistAVX2(SB), NOSPLIT, $0-32
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ n+16(FP), CX
	ZERO4
	XORQ AX, AX
	MOVQ CX, DX
	ANDQ $-16, DX
cp_loop16:
	CMPQ AX, DX
	JAE cp_tail
	VMOVUPS (SI)(AX*4), Y0
	VMOVUPS 32(SI)(AX*4), Y1
	VSUBPS (DI)(AX*4), Y0, Y2
	VSUBPS 32(DI)(AX*4), Y1, Y3
	VMOVUPS Y0, (DI)(AX*4)
	VMOVUPS Y1, 32(DI)(AX*4)
	SQUARES(Y2, X2, Y4, Y5, X5, Y10, Y11)
	SQUARES(Y3, X3, Y6, Y7, X7, Y12, Y13)
	ADDQ $16, AX
	JMP cp_loop16
cp_tail:
	CMPQ AX, CX
	JAE cp_done
	VMOVUPS (SI)(AX*4), Y0
	VSUBPS (DI)(AX*4), Y0, Y2
	VMOVUPS Y0, (DI)(AX*4)
	SQUARES(Y2, X2, Y4, Y5, X5, Y10, Y11)
cp_done:
	HSUM
	VMOVSD X12, ret+24(FP)
	VZEROUPPER
	RET

// func stepMergeAVX2(x, r, a *float32, n int, s, w float32) float64
TEXT ·stepMergeAVX2(SB), NOSPLIT, $0-48
	MOVQ x+0(FP), DI
	MOVQ r+8(FP), SI
	MOVQ a+16(FP), R8
	MOVQ n+24(FP), CX
	VBROADCASTSS s+32(FP), Y14
	VBROADCASTSS w+36(FP), Y15
	ZERO4
	XORQ AX, AX
	MOVQ CX, DX
	ANDQ $-16, DX
sm_loop16:
	CMPQ AX, DX
	JAE sm_tail
	VMOVUPS (DI)(AX*4), Y0
	VMOVUPS 32(DI)(AX*4), Y1
	VSUBPS (SI)(AX*4), Y0, Y2
	VSUBPS 32(SI)(AX*4), Y1, Y3
	SQUARES(Y2, X2, Y4, Y5, X5, Y10, Y11)
	SQUARES(Y3, X3, Y6, Y7, X7, Y12, Y13)
	VMULPS Y14, Y0, Y2
	VMULPS Y14, Y1, Y3
	VMOVUPS (R8)(AX*4), Y8
	VMOVUPS 32(R8)(AX*4), Y9
	VSUBPS Y2, Y8, Y8
	VSUBPS Y3, Y9, Y9
	VFMADD231PS Y15, Y8, Y0
	VFMADD231PS Y15, Y9, Y1
	VMOVUPS Y0, (DI)(AX*4)
	VMOVUPS Y1, 32(DI)(AX*4)
	VMOVUPS Y0, (SI)(AX*4)
	VMOVUPS Y1, 32(SI)(AX*4)
	ADDQ $16, AX
	JMP sm_loop16
sm_tail:
	CMPQ AX, CX
	JAE sm_done
	VMOVUPS (DI)(AX*4), Y0
	VSUBPS (SI)(AX*4), Y0, Y2
	SQUARES(Y2, X2, Y4, Y5, X5, Y10, Y11)
	VMULPS Y14, Y0, Y2
	VMOVUPS (R8)(AX*4), Y8
	VSUBPS Y2, Y8, Y8
	VFMADD231PS Y15, Y8, Y0
	VMOVUPS Y0, (DI)(AX*4)
	VMOVUPS Y0, (SI)(AX*4)
sm_done:
	HSUM
	VMOVSD X12, ret+40(FP)
	VZEROUPPER
	RET

// func scaleAVX2(dst, src *float32, n int, c float32)
TEXT ·scaleAVX2(SB), NOSPLIT, $0-28
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ n+16(FP), CX
	VBROADCASTSS c+24(FP), Y15
	XORQ AX, AX
sc_loop:
	CMPQ AX, CX
	JAE sc_done
	VMULPS (SI)(AX*4), Y15, Y0
	VMOVUPS Y0, (DI)(AX*4)
	ADDQ $8, AX
	JMP sc_loop
sc_done:
	VZEROUPPER
	RET

// func axpyAVX2(dst, src *float32, n int, c float32)
TEXT ·axpyAVX2(SB), NOSPLIT, $0-28
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ n+16(FP), CX
	VBROADCASTSS c+24(FP), Y15
	XORQ AX, AX
ax_loop:
	CMPQ AX, CX
	JAE ax_done
	VMOVUPS (DI)(AX*4), Y0
	VFMADD231PS (SI)(AX*4), Y15, Y0
	VMOVUPS Y0, (DI)(AX*4)
	ADDQ $8, AX
	JMP ax_loop
ax_done:
	VZEROUPPER
	RET

// func sumSqAVX2(v *float32, n int) float64
TEXT ·sumSqAVX2(SB), NOSPLIT, $0-24
	MOVQ v+0(FP), DI
	MOVQ n+8(FP), CX
	ZERO4
	XORQ AX, AX
	MOVQ CX, DX
	ANDQ $-16, DX
ss_loop16:
	CMPQ AX, DX
	JAE ss_tail
	VMOVUPS (DI)(AX*4), Y0
	VMOVUPS 32(DI)(AX*4), Y1
	SQUARES(Y0, X0, Y4, Y5, X5, Y10, Y11)
	SQUARES(Y1, X1, Y6, Y7, X7, Y12, Y13)
	ADDQ $16, AX
	JMP ss_loop16
ss_tail:
	CMPQ AX, CX
	JAE ss_done
	VMOVUPS (DI)(AX*4), Y0
	SQUARES(Y0, X0, Y4, Y5, X5, Y10, Y11)
ss_done:
	HSUM
	VMOVSD X12, ret+16(FP)
	VZEROUPPER
	RET
