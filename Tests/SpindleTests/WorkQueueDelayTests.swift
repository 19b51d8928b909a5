// `WorkQueue.async(after:)` and delayed work items: their deadlines wait in
// the standard pool's timer heap (beside the timer sources on queues), held
// by an idle worker or, while every worker computes, polled by the pool's
// watchdog. No timing goals: each check is "not before the deadline" and
// "eventually". The pool's poller always waits in epoll, whatever
// `SPINDLE_EVENT_BACKEND` picks for loops, so these run once.
#if canImport(Glibc)
import Glibc
#endif
import Spindle
import Testing
import TestSupport

@Suite("WorkQueue delayed submissions")
struct WorkQueueDelayTests {
    /// 40 closures on a serial queue, submitted in a shuffled order, with
    /// deadlines 1 ms apart (pairs share one): each runs at or after its
    /// deadline, and they run in deadline order, ties in submission order.
    @Test func delayedClosuresRunInDeadlineOrderAndNeverEarly() {
        let queue = WorkQueue(label: "delay.order")
        let start = MonotonicClock.now.advanced(by: .milliseconds(50))
        var generator = SplitMix(state: 37)
        let order = Array(0..<40).shuffled(using: &generator)
        let log = OrderLog()
        let early = LockedValue<[Int]>([])
        let group = WorkGroup()
        // Item k is due at start + (k / 2) ms: pairs share a deadline, and
        // the smaller k of a pair is submitted first (as its tie-break).
        var submittedFirst: [Int: Bool] = [:]
        for k in order {
            let pair = k / 2
            let mate = pair * 2 + (k % 2 == 0 ? 1 : 0)
            submittedFirst[k] = submittedFirst[mate] == nil
            let deadline = start.advanced(by: .milliseconds(Int64(pair)))
            group.enter()
            queue.async(after: deadline) {
                if MonotonicClock.now < deadline { early.withLock { $0.append(k) } }
                log.append(k)
                group.leave()
            }
        }
        // The order is promised among closures queued before their
        // deadlines. Submitting takes microseconds; a machine loaded enough
        // to preempt this thread for 50 ms made a later closure due before
        // earlier ones were queued (seen under two CPU hogs).
        let queuedInTime = MonotonicClock.now < start
        #expect(group.wait(timeout: .seconds(30)) == .completed)
        #expect(early.withLock { $0 }.isEmpty, "ran before their deadlines: \(early.withLock { $0 })")
        let ran = log.all
        #expect(ran.count == 40)
        // Deadline order across pairs; within a pair, submission order.
        let expected = (0..<20).flatMap { pair -> [Int] in
            let a = pair * 2, b = a + 1
            return submittedFirst[a] == true ? [a, b] : [b, a]
        }
        if queuedInTime {
            #expect(ran == expected)
        } else {
            print("delayedClosuresRunInDeadlineOrderAndNeverEarly: the submissions ran past the first deadline; the order is not checked")
        }
    }

    /// While every worker of the pool computes (one chain per worker of
    /// short computing items, each submitting the next: no worker parks to
    /// hold the poller), a 1 ms `async(after:)` on a global queue still
    /// runs, never before its deadline: the heap is polled between items
    /// and by the watchdog, which sleeps no longer than the heap's first
    /// deadline. The chains stop once it ran (or after 30 s).
    @Test func aDelayedClosureRunsWhileEveryWorkerComputes() {
        let release = Flag()
        let giveUp = MonotonicClock.now.advanced(by: .seconds(30))
        let chains = WorkGroup()
        @Sendable func link() {
            let end = MonotonicClock.now.advanced(by: .microseconds(200))
            while MonotonicClock.now < end { _ = (0..<100).reduce(0, &+) }
            if release.value == 0 && MonotonicClock.now < giveUp {
                WorkQueue.global().async(group: chains) { link() }
            }
        }
        for _ in 0..<WorkQueue.poolWidth { WorkQueue.global().async(group: chains) { link() } }
        let deadline = MonotonicClock.now.advanced(by: .milliseconds(1))
        let ran = Semaphore(value: 0)
        let early = Flag()
        WorkQueue.global().async(after: deadline) {
            if MonotonicClock.now < deadline { early.set() }
            _ = ran.signal()
        }
        let result = ran.wait(timeout: .seconds(30))
        release.set()
        #expect(result == .completed, "a 1 ms async(after:) did not run while the workers computed")
        #expect(early.value == 0, "ran before its deadline")
        #expect(chains.wait(timeout: .seconds(60)) == .completed)
    }

    /// A delayed closure on a suspended queue is submitted at its deadline
    /// but runs only after `resume()`, and then runs.
    @Test func aDelayedClosureOnASuspendedQueueRunsAfterResume() {
        let queue = WorkQueue(label: "delay.suspended")
        queue.suspend()
        let ran = Semaphore(value: 0)
        let resumed = Flag()
        let beforeResume = Flag()
        let deadline = MonotonicClock.now.advanced(by: .milliseconds(1))
        queue.async(after: deadline) {
            if resumed.value == 0 { beforeResume.set() }
            _ = ran.signal()
        }
        // Well past the deadline: the closure was submitted and waits.
        while MonotonicClock.now < deadline.advanced(by: .milliseconds(20)) { usleep(1000) }
        #expect(ran.wait(timeout: .milliseconds(1)) == .timedOut, "ran on a suspended queue")
        resumed.set()
        queue.resume()
        #expect(ran.wait(timeout: .seconds(30)) == .completed)
        #expect(beforeResume.value == 0)
    }

    /// A work item submitted with a delay and cancelled before its deadline
    /// is finished at once (its `wait` returns and its notification runs
    /// long before the hour-long deadline), and its closure never runs.
    @Test func aDelayedWorkItemCancelledBeforeItsDeadlineFinishesAtOnce() {
        let ran = Flag()
        let notified = Semaphore(value: 0)
        let item = WorkItem { ran.set() }
        item.notify(on: WorkQueue.global()) { _ = notified.signal() }
        WorkQueue.global().async(after: .seconds(3600), item)
        #expect(!item.isFinished)
        item.cancel()
        #expect(item.isCancelled)
        #expect(item.isFinished, "a cancelled delayed item waits for its deadline")
        #expect(item.wait(timeout: .seconds(30)) == .completed)
        #expect(notified.wait(timeout: .seconds(30)) == .completed)
        #expect(ran.value == 0)
    }

    /// A delayed work item that is not cancelled runs after its deadline;
    /// one cancelled after it ran stays run; submitting it again stops the
    /// process (checked in `WorkQueueMisuseTests` for `async`; here only
    /// the run).
    @Test func aDelayedWorkItemRunsAfterItsDeadline() {
        let deadline = MonotonicClock.now.advanced(by: .milliseconds(2))
        let early = Flag()
        let item = WorkItem { if MonotonicClock.now < deadline { early.set() } }
        WorkQueue(label: "delay.item").async(after: deadline, item)
        #expect(item.wait(timeout: .seconds(30)) == .completed)
        #expect(early.value == 0)
        #expect(!item.isCancelled)
    }

    /// A one-shot queue timer due in 1 ms with an hour of leeway may fire
    /// any time in that hour, but the poller is awake at 2 ms anyway (for a
    /// 2 ms `async(after:)`): it fires then, at or after its due time, not
    /// an hour late. (The heap used to fire an entry only once its latest
    /// moment, due time plus leeway, had come.)
    @Test func aQueueTimerWithALongLeewayFiresWhenThePollerWakesAnyway() {
        let due = MonotonicClock.now.advanced(by: .milliseconds(1))
        let fired = Semaphore(value: 0)
        let early = Flag()
        let timer = EventSource.timer(
            start: .monotonic(due), interval: nil, leeway: .seconds(3600), on: .queue(WorkQueue(label: "delay.leeway")))
        timer.setEventHandler { _ in
            if MonotonicClock.now < due { early.set() }
            _ = fired.signal()
        }
        timer.activate()
        let woke = Semaphore(value: 0)
        WorkQueue.global().async(after: .milliseconds(2)) { _ = woke.signal() }
        #expect(woke.wait(timeout: .seconds(30)) == .completed)
        #expect(fired.wait(timeout: .seconds(30)) == .completed, "the timer waited for its leeway with the poller awake")
        #expect(early.value == 0, "fired before its due time")
        timer.cancel()
    }

    /// In a process of its own (so that the count is this test's alone):
    /// 5,000 delayed items with an hour-long deadline are 5,000 pending
    /// entries of the heap; cancelling them empties it and finishes each.
    /// Then 5,000 closures with deadlines spread over 50 ms all run, none
    /// early, and leave the heap empty.
    @Test func thousandsOfDelayedSubmissionsLeaveTheHeapWhenCancelledOrRun() async {
        await #expect(processExitsWith: .success) {
            exit(thousandsOfDelayedSubmissions())
        }
    }

    /// A closure submitted with a 100 ms delay before `fork()`: the child
    /// keeps it (its queue goes on in the child) and runs it there, as the
    /// parent does. In a process of its own; the child has an alarm.
    @Test func aDelayedSubmissionPendingAtForkRunsInTheChild() async {
        await #expect(processExitsWith: .success) {
            exit(delayedSubmissionAcrossFork())
        }
    }
}

private func thousandsOfDelayedSubmissions() -> Int32 {
    let count = 5_000
    guard WorkQueue.pendingDelayedSubmissions == 0 else { return 1 }
    let items = (0..<count).map { _ in WorkItem {} }
    let queue = WorkQueue(label: "delay.thousands", kind: .concurrent)
    for item in items { queue.async(after: .seconds(3600), item) }
    guard WorkQueue.pendingDelayedSubmissions == count else { return 2 }
    for item in items { item.cancel() }
    guard WorkQueue.pendingDelayedSubmissions == 0 else { return 3 }
    guard items.allSatisfy(\.isFinished) else { return 4 }

    var generator = SplitMix(state: 5_000)
    let group = WorkGroup()
    let early = Flag()
    let start = MonotonicClock.now
    for _ in 0..<count {
        let deadline = start.advanced(by: .microseconds(Int64.random(in: 0..<50_000, using: &generator)))
        group.enter()
        queue.async(after: deadline) {
            if MonotonicClock.now < deadline { early.set() }
            group.leave()
        }
    }
    guard group.wait(timeout: .seconds(60)) == .completed else { return 5 }
    guard early.value == 0 else { return 6 }
    guard WorkQueue.pendingDelayedSubmissions == 0 else { return 7 }
    return 0
}

private func delayedSubmissionAcrossFork() -> Int32 {
    // The pool and its poller run before the fork.
    let warm = WorkGroup()
    for _ in 0..<8 { WorkQueue.global().async(group: warm) {} }
    guard warm.wait(timeout: .seconds(30)) == .completed else { return 1 }
    let serial = WorkQueue(label: "delay.fork")
    let deadline = MonotonicClock.now.advanced(by: .milliseconds(100))
    let ran = Semaphore(value: 0)
    let early = Flag()
    serial.async(after: deadline) {
        if MonotonicClock.now < deadline { early.set() }
        _ = ran.signal()
    }
    let pid = fork()
    guard pid >= 0 else { return 2 }
    if pid == 0 {
        alarm(60)
        guard WorkQueue.pendingDelayedSubmissions == 1 || ran.wait(timeout: .zero) == .completed else { _exit(3) }
        guard ran.wait(timeout: .seconds(30)) == .completed else { _exit(4) }
        _exit(early.value == 0 ? 0 : 5)
    }
    guard ran.wait(timeout: .seconds(30)) == .completed else { return 6 }
    var status: Int32 = 0
    guard waitpid(pid, &status, 0) == pid else { return 7 }
    // WIFEXITED / WEXITSTATUS, spelled out (macros Swift does not import).
    guard status & 0x7f == 0 else { return 100 + (status & 0x7f) }
    let code = (status >> 8) & 0xff
    return code == 0 ? (early.value == 0 ? 0 : 8) : 10 + code
}

/// A word that closures set and read, through atomics.
private final class Flag: @unchecked Sendable {
    // @unchecked: the word is read and written only through atomics.
    private let word = UnsafeMutablePointer<Int>.allocate(capacity: 1)
    init() { word.initialize(to: 0) }
    deinit { word.deallocate() }

    func set() { AtomicMemory.store(1, to: word, ordering: .releasing) }
    var value: Int { AtomicMemory.load(from: word, ordering: .acquiring) }
}
