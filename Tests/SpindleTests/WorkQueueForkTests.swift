// Work queues across fork() (DESIGN: after fork the child starts with fresh
// per-thread state): the child of a process whose pool had started workers
// has only the forking thread, and Spindle resets its pools and its delay
// thread there, so the child's queues work.
#if canImport(Glibc)
import Glibc
#endif
import Spindle
import Testing
import TestSupport

@Suite("WorkQueue across fork")
struct WorkQueueForkTests {
    /// After the pool, a serial queue and the delay thread have run work,
    /// the process forks. In the child: a global `async`, a serial queue's
    /// `sync` queued behind other items, `async(after:)` and a group `wait`
    /// all complete. The parent waits for the child with `waitpid`, checks
    /// its exit status, and its own queues keep working. In an exit test, so
    /// the test runner's threads are not forked.
    @Test func queuesWorkInTheChildAfterFork() async {
        await #expect(processExitsWith: .success) {
            exit(forkAfterThePoolHasStarted())
        }
    }
}

/// Returns 0 when the child and the parent passed, else the number of the
/// failed check (the child's own failures are its exit status; 128 + n for
/// a signal, such as the alarm that ends a hung child).
private func forkAfterThePoolHasStarted() -> Int32 {
    let serial = WorkQueue(label: "fork.serial")
    let warm = WorkGroup()
    for i in 0..<64 {
        WorkQueue.global().async(group: warm) { _ = (0..<1000).reduce(i, &+) }
    }
    for _ in 0..<16 { serial.async(group: warm) {} }
    let delayed = Semaphore(value: 0)
    WorkQueue.global().async(after: .milliseconds(1)) { _ = delayed.signal() }
    guard warm.wait(timeout: .seconds(30)) == .completed, delayed.wait(timeout: .seconds(30)) else { return 100 }
    guard WorkQueue.workerThreadCount(for: .default) > 0 else { return 101 }

    let child = fork()
    if child == 0 {
        armHangAlarm(seconds: 60)  // a hang fails the test instead of stalling it
        _exit(childUsesTheQueues(serial))
    }
    guard child > 0 else { return 102 }
    var status: Int32 = 0
    guard waitpid(child, &status, 0) == child else { return 103 }
    let signal = status & 0x7f
    let childResult = signal == 0 ? (status >> 8) & 0xff : 128 + signal
    guard childResult == 0 else { return childResult }

    // The parent's pool and queue are untouched by the child's reset.
    let after = WorkGroup()
    WorkQueue.global().async(group: after) {}
    serial.async(group: after) {}
    guard after.wait(timeout: .seconds(30)) == .completed else { return 104 }
    return 0
}

/// In the forked child: 0 if everything completed, else the failed check.
private func childUsesTheQueues(_ serial: WorkQueue) -> Int32 {
    // Only the forking thread came across.
    guard processThreadCount() == 1 else { return 10 }

    // A global async.
    let ran = Semaphore(value: 0)
    WorkQueue.global().async { _ = ran.signal() }
    guard ran.wait(timeout: .seconds(20)) else { return 11 }

    // The parent's serial queue: a sync queued behind 100 items, the first
    // of which waits for a global item, returns after all of them.
    let hold = Semaphore(value: 0)
    let log = OrderLog()
    serial.async { _ = hold.wait(timeout: .seconds(20)) }
    for i in 0..<100 { serial.async { log.append(i) } }
    WorkQueue.global().async { _ = hold.signal() }
    let countSeenBySync = serial.sync { log.count }
    guard countSeenBySync == 100, log.all == Array(0..<100) else { return 12 }

    // async(after:): the delay thread is gone; the child gets its own.
    let deadline = MonotonicClock.now.advanced(by: .milliseconds(5))
    let fired = Semaphore(value: 0)
    let early = LockedValue(false)
    serial.async(after: deadline) {
        if MonotonicClock.now < deadline { early.withLock { $0 = true } }
        _ = fired.signal()
    }
    guard fired.wait(timeout: .seconds(20)) else { return 13 }
    guard !early.withLock({ $0 }) else { return 14 }

    // A group of items on the global queue, waited for at once.
    let group = WorkGroup()
    let members = OrderLog()
    for i in 0..<50 {
        WorkQueue.global().async(group: group) { members.append(i) }
    }
    guard group.wait(timeout: .seconds(20)) == .completed else { return 15 }
    group.wait()
    guard members.all.sorted() == Array(0..<50) else { return 16 }

    // The child started workers of its own.
    guard WorkQueue.workerThreadCount(for: .default) > 0, processThreadCount() > 1 else { return 17 }
    return 0
}
