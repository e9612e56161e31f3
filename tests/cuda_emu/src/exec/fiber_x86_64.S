// Fiber context switch for the block executor (x86-64 System V).
//
// void cuemu_fiber_switch(void** save_sp, void* new_sp)
//   Pushes the callee-saved registers, MXCSR and the x87 control word on the
//   current stack, stores the stack pointer in *save_sp, switches to new_sp
//   and restores the same frame from there. No syscalls, no signal mask.
//
// cuemu_fiber_start: the first "return address" of a new fiber: calls
//   rbx(r12, r13) on the fresh stack and must never return.
        .text
        .globl  cuemu_fiber_switch
        .hidden cuemu_fiber_switch
        .type   cuemu_fiber_switch, @function
cuemu_fiber_switch:
        .cfi_startproc
        pushq   %rbp
        pushq   %rbx
        pushq   %r12
        pushq   %r13
        pushq   %r14
        pushq   %r15
        subq    $8, %rsp
        stmxcsr (%rsp)
        fnstcw  4(%rsp)
        movq    %rsp, (%rdi)
        movq    %rsi, %rsp
        ldmxcsr (%rsp)
        fldcw   4(%rsp)
        addq    $8, %rsp
        popq    %r15
        popq    %r14
        popq    %r13
        popq    %r12
        popq    %rbx
        popq    %rbp
        ret
        .cfi_endproc
        .size   cuemu_fiber_switch, .-cuemu_fiber_switch

        .globl  cuemu_fiber_start
        .hidden cuemu_fiber_start
        .type   cuemu_fiber_start, @function
cuemu_fiber_start:
        .cfi_startproc
        .cfi_undefined rip
        movq    %r12, %rdi
        movq    %r13, %rsi
        call    *%rbx
        ud2
        .cfi_endproc
        .size   cuemu_fiber_start, .-cuemu_fiber_start

        .section .note.GNU-stack,"",@progbits
