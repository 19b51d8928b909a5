import CShims
import Spindle
import Testing
import TestSupport

#if canImport(Glibc)
import Glibc
#endif

/// A plain counter that a lock protects; deliberately not atomic.
final class Guarded: @unchecked Sendable {
    // @unchecked: every access happens under the lock the test is about.
    var value = 0
}

/// Every `Locking` type through the common contract.
enum AnyTestLock: CustomStringConvertible, CaseIterable {
    case lock, recursive, spin, readWrite
    func make() -> any Locking {
        switch self {
        case .lock: Lock()
        case .recursive: RecursiveLock()
        case .spin: SpinLock()
        case .readWrite: ReadWriteLock()
        }
    }
    var description: String {
        switch self {
        case .lock: "Lock"
        case .recursive: "RecursiveLock"
        case .spin: "SpinLock"
        case .readWrite: "ReadWriteLock"
        }
    }
}

@Suite("Locking contract")
struct LockingContractTests {
    @Test(arguments: AnyTestLock.allCases)
    func tryLockFailsWhileHeldElsewhere(kind: AnyTestLock) {
        let lock = kind.make()
        #expect(lock.tryLock())
        let join = startThread {
            #expect(!lock.tryLock(), "another thread holds it")
            #expect(!lock.lock(timeout: .milliseconds(5)))
        }
        join()
        lock.unlock()
        let join2 = startThread {
            #expect(lock.tryLock())
            lock.unlock()
        }
        join2()
    }

    /// Only the lower bound is asserted.
    @Test(arguments: AnyTestLock.allCases)
    func deadlineIsHonoured(kind: AnyTestLock) {
        let lock = kind.make()
        lock.lock()
        defer { lock.unlock() }
        let join = startThread {
            let start = MonotonicClock.now
            #expect(!lock.lock(timeout: .milliseconds(20)))
            #expect(start.duration(to: .now) >= .milliseconds(20))
            // A deadline in the past is a tryLock.
            #expect(!lock.lock(before: start))
        }
        join()
    }

    @Test(arguments: AnyTestLock.allCases)
    func withLockReturnsAndRethrowsAndUnlocks(kind: AnyTestLock) {
        struct Boom: Error {}
        let lock = kind.make()
        #expect(lock.withLock { 42 } == 42)
        #expect(throws: Boom.self) { try lock.withLock { throw Boom() } }
        // Released on the throwing path: another thread can take it.
        let join = startThread { #expect(lock.tryLock()); lock.unlock() }
        join()
        #expect(lock.withLock(before: .distantFuture) { "ok" } == "ok")
    }

    @Test(arguments: AnyTestLock.allCases)
    func blockedLockerGetsInAfterUnlock(kind: AnyTestLock) {
        let lock = kind.make()
        let value = Guarded()
        lock.lock()
        let join = startThread {
            lock.lock()  // sleeps until the main thread unlocks
            value.value += 1
            lock.unlock()
        }
        usleep(20_000)
        value.value = 10
        lock.unlock()
        join()
        lock.lock()
        #expect(value.value == 11)
        lock.unlock()
    }

    @Test(arguments: AnyTestLock.allCases)
    func mutualExclusionUnderContention(kind: AnyTestLock) {
        let lock = kind.make()
        let value = Guarded()
        runThreads(4) { _ in
            for _ in 0..<20_000 { lock.withLock { value.value += 1 } }
        }
        #expect(value.value == 80_000)
    }

    /// A polling `tryLock()` wins while 8 threads hammer `lock()`/`unlock()`
    /// with nothing outside the lock: these locks barge (an unlock frees the
    /// lock; a waiter it wakes competes for it), so the lock is free now and
    /// then, and a try that comes then wins, as `pthread_mutex_trylock` does
    /// (about a quarter of such tries here). The check `ConditionLock` failed
    /// (issue 38). Counts wins, not time; the minimum, 1%, is far below
    /// what these locks get here alone (14–85%).
    @Test(arguments: AnyTestLock.allCases)
    func tryLockWinsWhileOthersHammer(kind: AnyTestLock) {
        let lock = kind.make()
        let value = Guarded()
        let tries = 2_000
        let (won, hammered) = countTriesWonWhileHammered(
            hammerers: 8, tries: tries, spacingMicroseconds: 50,
            hammer: { lock.withLock { value.value += 1 } },
            tryOnce: {
                guard lock.tryLock() else { return false }
                value.value += 1
                lock.unlock()
                return true
            })
        #expect(won >= tries / 100, "\(kind).tryLock won \(won) of \(tries) tries while others hammered")
        #expect(value.value == hammered + won, "exclusion held")
    }
}

@Suite("Lock")
struct LockTests {
    @Test func idleWordIsZeroAfterUse() {
        let lock = Lock()
        #expect(lock.wordValue == 0)
        lock.lock()
        #expect(lock.wordValue == 1)
        lock.unlock()
        #expect(lock.wordValue == 0)
    }

    @Test func copiesShareTheLock() {
        let a = Lock()
        let b = a
        a.lock()
        #expect(!b.tryLock())
        b.unlock()
        #expect(a == b)
        #expect(a != Lock())
    }

    @Test func distantFutureDeadlineWaitsUntilUnlocked() {
        let lock = Lock()
        lock.lock()
        let join = startThread {
            #expect(lock.lock(before: .distantFuture))
            lock.unlock()
        }
        usleep(10_000)
        lock.unlock()
        join()
        #expect(lock.wordValue == 0)
    }
}

@Suite("RecursiveLock")
struct RecursiveLockTests {
    @Test func holderMayReacquire() {
        let lock = RecursiveLock()
        lock.lock()
        #expect(lock.tryLock())
        #expect(lock.lock(timeout: .zero))
        #expect(lock.isHeldByCurrentThread)
        lock.unlock()
        lock.unlock()
        let join = startThread { #expect(!lock.tryLock(), "still held once") }
        join()
        lock.unlock()
        #expect(!lock.isHeldByCurrentThread)
        #expect(lock.wordValue == 0)
        let join2 = startThread { #expect(lock.tryLock()); lock.unlock() }
        join2()
    }

    /// The guide's recursive function, rebuilt: each level takes the lock.
    @Test func recursionDoesNotDeadlock() {
        let lock = RecursiveLock()
        func countdown(_ n: Int) -> Int {
            lock.withLock { n == 0 ? 0 : 1 + countdown(n - 1) }
        }
        #expect(countdown(100) == 100)
        #expect(lock.wordValue == 0)
    }
}

@Suite("ReadWriteLock")
struct ReadWriteLockTests {
    @Test func readersShareWritersExclude() {
        let rw = ReadWriteLock()
        rw.readLock()
        #expect(rw.tryReadLock(), "a second reader gets in")
        #expect(!rw.tryWriteLock(), "no writer while readers hold it")
        rw.readUnlock()
        rw.readUnlock()
        #expect(rw.wordValue == 0)
        rw.writeLock()
        #expect(!rw.tryReadLock())
        #expect(!rw.tryWriteLock())
        #expect(!rw.readLock(timeout: .milliseconds(5)))
        rw.writeUnlock()
        #expect(rw.wordValue == 0)
        #expect(rw.withReadLock { 1 } + rw.withWriteLock { 2 } == 3)
    }

    /// Writer preference, as the guide describes it: while a writer waits,
    /// a new reader blocks even though only readers hold the lock.
    @Test func waitingWriterBlocksNewReaders() {
        let rw = ReadWriteLock()
        rw.readLock()
        let join = startThread {
            rw.writeLock()  // waits for the reader
            rw.writeUnlock()
        }
        // Wait until the writer has announced itself.
        let deadline = MonotonicClock.now.advanced(by: .seconds(30))
        while rw.wordValue & (1 << 31) == 0 && MonotonicClock.now < deadline { usleep(1_000) }
        let blocked = startThread {
            #expect(!rw.tryReadLock(), "a new reader must queue behind the waiting writer")
        }
        blocked()
        rw.readUnlock()
        join()
        #expect(rw.tryReadLock())
        rw.readUnlock()
    }

    @Test func writeDeadlineIsHonoured() {
        let rw = ReadWriteLock()
        rw.readLock()
        let join = startThread {
            let start = MonotonicClock.now
            #expect(!rw.writeLock(timeout: .milliseconds(20)))
            #expect(start.duration(to: .now) >= .milliseconds(20))
        }
        join()
        // The writer gave up: readers are not left blocked behind its flag.
        let reader = startThread { #expect(rw.readLock(timeout: .seconds(10))); rw.readUnlock() }
        reader()
        rw.readUnlock()
        #expect(rw.wordValue & 0x3FFF_FFFF == 0)
    }
}

@Suite("Once")
struct OnceTests {
    @Test func runsExactlyOnceAcrossThreads() {
        let once = Once()
        let runs = Guarded()
        let seen = UnsafeMutablePointer<Int>.allocate(capacity: 8)
        seen.initialize(repeating: 0, count: 8)
        defer { seen.deallocate() }
        let box = SharedPointer(seen)
        runThreads(8) { i in
            once.run {
                usleep(10_000)  // make the others wait
                runs.value += 1
            }
            // Everything the body wrote is visible after run returns.
            box.pointer[i] = runs.value
        }
        #expect(runs.value == 1)
        #expect((0..<8).allSatisfy { seen[$0] == 1 })
        #expect(once.isDone)
    }

    @Test func aThrowingBodyLeavesItNotDone() {
        struct Boom: Error {}
        let once = Once()
        #expect(throws: Boom.self) { try once.run { throw Boom() } }
        #expect(!once.isDone)
        var ran = false
        once.run { ran = true }
        #expect(ran && once.isDone)
        once.run { Issue.record("a done Once ran its body again") }
    }
}

@Suite("synchronized")
struct SynchronizedTests {
    final class Token {}

    @Test func sameObjectExcludes() {
        let token = Token()
        let value = Guarded()
        let tokenBox = Unchecked(token)
        runThreads(4) { _ in
            for _ in 0..<10_000 { synchronized(tokenBox.value) { value.value += 1 } }
        }
        #expect(value.value == 40_000)
    }

    @Test func recursiveOnOneThreadAndReleasedOnThrow() {
        struct Boom: Error {}
        let token = Token()
        let n = synchronized(token) { synchronized(token) { 7 } }
        #expect(n == 7)
        #expect(throws: Boom.self) { try synchronized(token) { throw Boom() } }
        let box = Unchecked(token)
        let join = startThread {
            // Would hang if the throw had left the stripe locked.
            synchronized(box.value) {}
        }
        join()
        #expect(synchronizedStripes >= 64)
    }

    /// With 256 shared stripes, `synchronized` on one object blocked threads
    /// on every object that hashed to its stripe. Each object has its own
    /// lock now: while one thread holds `held`, another enters and leaves
    /// `synchronized` on 2,000 other objects (some of which shared its stripe
    /// before). Bounded, so that a regression fails instead of hanging.
    @Test func differentObjectsNeverBlockEachOther() {
        let held = Token()
        let others = Unchecked((0..<2_000).map { _ in Token() })
        let inside = Latch()
        let release = Latch()
        let done = Latch()
        let box = Unchecked(held)
        let holder = startThread {
            synchronized(box.value) {
                inside.countDown()
                _ = release.wait()
            }
        }
        _ = inside.wait()
        let visitor = startThread {
            for object in others.value { synchronized(object) {} }
            done.countDown()
        }
        let finished = done.wait(seconds: 10)
        release.countDown()
        holder()
        visitor()
        #expect(finished, "synchronized on another object waited for the holder of `held`")
    }

    /// Eight threads over 512 shared objects: entries are found, waited
    /// for, rebound and added concurrently, and each object still excludes.
    @Test func manySharedObjectsEachExcludeWhileEntriesAreRebound() {
        let objects = (0..<512).map { _ in Guarded() }
        runThreads(8) { index in
            for i in 0..<20_000 {
                let object = objects[(i &* 7 &+ index &* 131) % 512]
                synchronized(object) { object.value += 1 }
            }
        }
        #expect(objects.reduce(0) { $0 + $1.value } == 8 * 20_000)
    }

    /// Nested blocks on pairs of objects, in opposite orders on different
    /// threads (each pair used by one thread only, so there is no lock-order
    /// inversion of the test's own): no deadlock, and exclusion holds while
    /// entries are taken and reused.
    @Test func nestedBlocksOnDistinctObjectsAndEntriesAreReused() {
        let pairs = Unchecked((0..<64).map { _ in (Token(), Token()) })
        let value = Guarded()
        runThreads(4) { index in
            for round in 0..<2_000 {
                let (a, b) = pairs.value[(round * 4 + index) % 64]
                let (first, second): (Token, Token) = index % 2 == 0 ? (a, b) : (b, a)
                synchronized(first) { synchronized(second) { synchronized(value) { value.value += 1 } } }
            }
        }
        #expect(value.value == 8_000)
    }
}


@Suite("Locks and deadlines already past")
struct PastDeadlineTests {
    /// Held by another thread, so that a recursive lock does not simply recurse.
    private func whileHeldElsewhere(_ lock: any Locking, _ body: () -> Void) {
        let held = Latch()
        let release = Latch()
        let join = startThread {
            lock.lock()
            held.countDown()
            _ = release.wait()
            lock.unlock()
        }
        _ = held.wait()
        body()
        release.countDown()
        join()
    }

    /// A past deadline on a held lock is exactly `tryLock`: the word stays
    /// "held, nobody waiting", so the holder's unlock makes no system call.
    @Test(arguments: AnyTestLock.allCases)
    func pastDeadlineOnAHeldLockLeavesTheWordAsTryLockDoes(kind: AnyTestLock) {
        let lock = kind.make()
        func word() -> UInt32 {
            switch lock {
            case let l as Lock: l.wordValue
            case let l as RecursiveLock: l.wordValue
            case let l as SpinLock: l.wordValue
            case let l as ReadWriteLock: l.wordValue
            default: 0
            }
        }
        whileHeldElsewhere(lock) {
            let heldWord = word()
            #expect(!lock.tryLock())
            #expect(word() == heldWord)
            #expect(!lock.lock(timeout: .zero))
            #expect(word() == heldWord)
            #expect(!lock.lock(before: MonotonicClock.now))
            #expect(word() == heldWord)
            #expect(!lock.lock(before: MonotonicClock.Instant(nanoseconds: 0)))
            #expect(word() == heldWord)
        }
        #expect(word() == 0)
    }

    @Test func pastDeadlineOnAFreeLockTakesIt() {
        for lock in AnyTestLock.allCases.map({ $0.make() }) {
            #expect(lock.lock(timeout: .zero))
            lock.unlock()
            #expect(lock.lock(before: MonotonicClock.Instant(nanoseconds: 0)))
            lock.unlock()
        }
    }

    /// A waiter ends its bounded spin asleep on the lock word; after the
    /// starvation bound it becomes the heir and asks for the lock (`request`
    /// in the word, the heir's place taken); the holder's unlock hands the
    /// lock over, and afterwards the word is idle and nobody is left
    /// starving.
    @Test func starvingWaiterAsksAndIsHandedTheLock() {
        let lock = Lock()
        let value = Guarded()
        lock.lock()
        let join = startThread {
            lock.lock()
            value.value += 1
            lock.unlock()
        }
        let giveUpAt = MonotonicClock.now.advanced(by: .seconds(10))
        while lock.wordValue & 8 == 0 && MonotonicClock.now < giveUpAt { usleep(1_000) }
        #expect(lock.threadsWaitingForTurn == 1, "the waiter starved and became the heir")
        #expect(lock.wordValue & 0b1011 == 0b1011, "locked, parked (left by the waiter) and requested")
        lock.unlock()
        join()
        #expect(lock.withLock { value.value } == 1)
        #expect(lock.wordValue == 0)
        #expect(lock.threadsWaitingForTurn == 0)
    }
}

@Suite("SpinLock")
struct SpinLockTests {
    /// A waiter ends its bounded spin asleep on the lock word (state 2), and
    /// the holder's unlock wakes it: no yielding, no polling naps.
    @Test func waiterSleepsOnTheWordUntilUnlock() {
        let lock = SpinLock()
        let value = Guarded()
        lock.lock()
        let join = startThread {
            lock.lock()
            value.value += 1
            lock.unlock()
        }
        let giveUpAt = MonotonicClock.now.advanced(by: .seconds(10))
        while lock.wordValue != 2 && MonotonicClock.now < giveUpAt { usleep(1_000) }
        #expect(lock.wordValue == 2, "the waiter marked the word and sleeps on it")
        lock.unlock()
        join()
        #expect(lock.withLock { value.value } == 1)
        #expect(lock.wordValue == 0)
    }

    @Test func timedWaiterGivesUpAndLeavesTheLockUsable() {
        let lock = SpinLock()
        lock.lock()
        let join = startThread {
            #expect(!lock.lock(timeout: .milliseconds(5)))
        }
        join()
        lock.unlock()
        #expect(lock.wordValue == 0)
        #expect(lock.tryLock())
        lock.unlock()
    }
}

/// Whether a thread may install a seccomp filter here (probed on a thread of
/// its own, which the filter dies with).
let seccompTrapsAvailable: Bool = {
    nonisolated(unsafe) var rc: Int32 = 0
    let join = startThread { rc = cshims_trap_scheduling_calls() }
    join()
    return rc == 0
}()

@Suite("Locks leave the caller's scheduling alone")
struct LockSchedulingTests {
    /// Sixteen threads on every lock kind, each thread under a seccomp filter
    /// that turns `sched_yield` and `sched_setaffinity` into SIGSYS: the
    /// child process survives only if no lock path makes either call.
    @Test(.enabled(if: seccompTrapsAvailable, "seccomp filters are not available here"))
    func contendedLocksNeverYieldOrSetAffinity() async {
        let result = await #expect(processExitsWith: .success, observing: [\.standardErrorContent]) {
            let lock = Lock()
            let recursive = RecursiveLock()
            let spin = SpinLock()
            let readWrite = ReadWriteLock()
            let conditionLock = ConditionLock(condition: 0)
            let condition = Condition()
            // One counter per lock: threads move from one lock to the next at
            // their own pace.
            let counts = (0..<5).map { _ in Guarded() }
            let turns = Guarded()
            let threads = 16
            runThreads(threads) { index in
                precondition(cshims_trap_scheduling_calls() == 0, "seccomp filter refused")
                for _ in 0..<20_000 { lock.withLock { counts[0].value += 1 } }
                for _ in 0..<5_000 { spin.withLock { counts[1].value += 1 } }
                for _ in 0..<5_000 { recursive.withLock { recursive.withLock { counts[2].value += 1 } } }
                for _ in 0..<5_000 { readWrite.withLock { counts[3].value += 1 } }
                for _ in 0..<2_000 { conditionLock.withLock { counts[4].value += 1 } }
                // Threads take turns in index order through one condition.
                for round in 0..<50 {
                    condition.lock()
                    while turns.value != round * threads + index { condition.wait() }
                    turns.value += 1
                    condition.broadcast()
                    condition.unlock()
                }
            }
            let expected = [20_000, 5_000, 5_000, 5_000, 2_000].map { $0 * threads }
            precondition(counts.map(\.value) == expected, "lost updates: \(counts.map(\.value))")
        }
        if case .exitCode(0)? = result?.exitStatus {} else {
            Issue.record("child's stderr: \(String(decoding: result?.standardErrorContent ?? [], as: UTF8.self))")
        }
    }
}
