#include "textflag.h"

// sigDrop is a signal handler that returns at once (see dropSignals).
TEXT sigDrop<>(SB), NOSPLIT|NOFRAME, $0
	RET

// sigReturn is sigDrop's restorer: the kernel makes the handler return into
// it (LR), and it asks the kernel to resume what the signal interrupted.
TEXT sigReturn<>(SB), NOSPLIT|NOFRAME, $0
	MOVD $139, R8 // SYS_rt_sigreturn
	SVC

GLOBL ·sigDropPC(SB), RODATA, $8
DATA ·sigDropPC(SB)/8, $sigDrop<>(SB)
GLOBL ·sigReturnPC(SB), RODATA, $8
DATA ·sigReturnPC(SB)/8, $sigReturn<>(SB)
