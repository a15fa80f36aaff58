// SPDX-License-Identifier: GPL-2.0
/*
 * A real soft lockup on demand, for kstall's kernel-matrix VMs (tests/tests/vm_scenarios.rs):
 * writing N to /sys/module/kstall_spin/parameters/spin_seconds makes the writer spin N seconds
 * in the kernel with preemption off, as an NFS client livelocked in its page-request locking
 * does. Interrupts stay on (no hard lockup): the watchdog's timer interrupts the spin and reports
 * it. Built per kernel by `cargo xtask vm-test`; never loaded outside a test VM.
 */
#include <linux/jiffies.h>
#include <linux/kernel.h>
#include <linux/module.h>
#include <linux/moduleparam.h>
#include <linux/preempt.h>
#include <linux/processor.h>

/* Out of line, in .text: the frame kstall's stack must show once the module is loaded. */
static noinline void kstall_spin(unsigned int seconds)
{
	unsigned long end = jiffies + seconds * HZ;

	preempt_disable();
	while (time_before(jiffies, end))
		cpu_relax();
	preempt_enable();
}

static int spin_seconds_set(const char *value, const struct kernel_param *kp)
{
	unsigned int seconds;
	int err = kstrtouint(value, 10, &seconds);

	if (err)
		return err;
	if (seconds > 120)
		return -ERANGE;
	kstall_spin(seconds);
	return 0;
}

static const struct kernel_param_ops spin_seconds_ops = {
	.set = spin_seconds_set,
};
module_param_cb(spin_seconds, &spin_seconds_ops, NULL, 0200);
MODULE_PARM_DESC(spin_seconds, "write N: the writer spins N seconds (at most 120) with preemption off");

MODULE_LICENSE("GPL");
MODULE_DESCRIPTION("kstall test: a soft lockup on demand");
