import Spindle
import TestSupport
import Testing

/// The lock-order checker (`LockOrder`, issue 36 part 2) and the re-lock
/// check of `Lock` (issue 39). Each inversion runs in a child process that
/// switches the checker on (`LockOrder.enable()`, as `SPINDLE_LOCK_ORDER=1`
/// would) and must stop with a report, at the acquisition that closes the
/// cycle, before any thread waits: the threads take their locks one after
/// the other, so a checker that missed the cycle would let the child exit
/// normally (the expectation of a failure exit then fails), never hang.
@Suite struct LockOrderTests {
    @Test func anABBAPairIsReportedWithTheLocksAndTheirSites() async {
        let result = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
            LockOrder.enable()
            let a = Spindle.Lock()
            a.name = "accounts"
            let b = Spindle.Lock()
            b.name = "ledger"
            startThread {
                a.lock()
                b.lock()  // the edge accounts -> ledger
                b.unlock()
                a.unlock()
            }()
            startThread {
                b.lock()
                a.lock()  // ledger -> accounts closes the cycle: reported here
                a.unlock()
                b.unlock()
            }()
        }
        let text = stderrText(result)
        #expect(text.contains("lock order"), "\(text)")
        #expect(text.contains("acquiring Lock \"accounts\" (0x"), "\(text)")
        #expect(text.contains("while holding Lock \"ledger\" (0x"), "\(text)")
        // Each edge of the cycle, with the place its second lock was taken
        // (here inside the `#expect` macro's expansion of this test).
        #expect(text.contains(") -> Lock \"ledger\" (0x"), "\(text)")
        #expect(text.contains(") -> Lock \"accounts\" (0x"), "\(text)")
        #expect(text.contains("acquired while holding it at /"), "\(text)")
        #expect(text.contains("anABBAPairIsReportedWithTheLocksAndTheirSites()"), "\(text)")
    }

    @Test func aThreeLockCycleAcrossThreeThreadsIsReported() async {
        let result = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
            LockOrder.enable()
            let locks = (0..<3).map { index -> Spindle.Lock in
                let lock = Spindle.Lock()
                lock.name = "L\(index)"
                return lock
            }
            // Thread i takes L(i), then L(i+1): the third closes L0 -> L1 -> L2 -> L0.
            for index in 0..<3 {
                startThread {
                    let first = locks[index]
                    let second = locks[(index + 1) % 3]
                    first.lock()
                    second.lock()
                    second.unlock()
                    first.unlock()
                }()
            }
        }
        let text = stderrText(result)
        #expect(text.contains("lock order"), "\(text)")
        #expect(text.contains("acquiring Lock \"L0\" (0x"), "\(text)")
        #expect(text.contains("while holding Lock \"L2\" (0x"), "\(text)")
        #expect(text.contains(") -> Lock \"L1\" (0x"), "\(text)")
        #expect(text.contains(") -> Lock \"L2\" (0x"), "\(text)")
        #expect(text.contains(") -> Lock \"L0\" (0x"), "\(text)")
    }

    @Test func aCycleThroughSynchronizedObjectsIsReported() async {
        let result = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
            LockOrder.enable()
            let account = Account()
            let audit = AuditLog()
            startThread {
                synchronized(account) {
                    synchronized(account) {  // recursion: no cycle
                        synchronized(audit) {}
                    }
                }
            }()
            startThread {
                synchronized(audit) {
                    synchronized(account) {}
                }
            }()
        }
        let text = stderrText(result)
        #expect(text.contains("lock order"), "\(text)")
        #expect(text.contains("synchronized(Account)"), "\(text)")
        #expect(text.contains("synchronized(AuditLog)"), "\(text)")
    }

    /// `synchronized` objects are known by their address, which a later
    /// object may get once they are freed: the objects of one round,
    /// nested first-then-second and then freed first-then-second, come
    /// back from the allocator swapped (the last freed first), so the next
    /// round's nesting is the previous one's reversed, by address. Dead
    /// objects' history is dropped, so nothing is reported; and the graph
    /// does not keep a node per object ever locked.
    @Test func objectsAtTheAddressesOfFreedOnesStartWithNoHistory() async {
        let result = await #expect(processExitsWith: .success, observing: [\.standardErrorContent]) {
            LockOrder.enable()
            let keeper = Spindle.Lock()
            var previous: (UInt, UInt)?
            var swapped = 0
            for _ in 0..<2_000 {
                var first: Account? = Account()
                var second: Account? = Account()
                let ids = (UInt(bitPattern: ObjectIdentifier(first!).hashValue), UInt(bitPattern: ObjectIdentifier(second!).hashValue))
                if let p = previous, ids.0 == p.1 && ids.1 == p.0 { swapped += 1 }
                keeper.withLock {
                    synchronized(first!) { synchronized(second!) {} }
                }
                previous = ids
                first = nil
                second = nil
                _ = (first, second)
            }
            let nodes = LockOrder.nodeCount
            // Without a swapped round the test would prove nothing.
            check(swapped > 0, "no round reused the previous round's addresses swapped (\(swapped))")
            check(nodes < 2_048, "the graph kept \(nodes) nodes for 4,000 objects locked and freed")
        }
        let text = stderrText(result)
        #expect(!text.contains("lock order"), "\(text)")
    }

    /// Readers queue behind a waiting writer: with `table` read-held by
    /// the first thread and a writer waiting, the second thread's read
    /// waits behind the writer while the first waits for `log`. So readers
    /// in opposite orders are a cycle, as lockdep reports for an
    /// `rw_semaphore`.
    @Test func readersInOppositeOrdersAreACycleBecauseReadersQueueBehindWriters() async {
        let result = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
            LockOrder.enable()
            let table = ReadWriteLock()
            let log = Spindle.Lock()
            log.name = "log"
            startThread {
                table.readLock()
                log.lock()
                log.unlock()
                table.readUnlock()
            }()
            startThread {
                log.lock()
                table.readLock()
                table.readUnlock()
                log.unlock()
            }()
        }
        let text = stderrText(result)
        #expect(text.contains("lock order: acquiring ReadWriteLock"), "\(text)")
        #expect(text.contains("while holding Lock \"log\""), "\(text)")
    }

    /// A writer against a reader's order is a cycle too.
    @Test func aWriterAgainstAReadersOrderIsACycle() async {
        let result = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
            LockOrder.enable()
            let table = ReadWriteLock()
            let log = Spindle.Lock()
            log.name = "log"
            startThread {
                table.readLock()
                log.lock()
                log.unlock()
                table.readUnlock()
            }()
            startThread {
                log.lock()
                table.writeLock()
                table.writeUnlock()
                log.unlock()
            }()
        }
        let text = stderrText(result)
        #expect(text.contains("lock order: acquiring ReadWriteLock"), "\(text)")
        #expect(text.contains("while holding Lock \"log\""), "\(text)")
    }

    /// Taking a read lock again while holding it for reading deadlocks as
    /// soon as a writer waits between the two (`ReadWriteLock` prefers
    /// writers): reported at the second acquisition, before it can wait.
    @Test func aReadLockTakenAgainForReadingIsASelfDeadlock() async {
        let result = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
            LockOrder.enable()
            let table = ReadWriteLock()
            table.readLock()
            table.readLock()
        }
        let text = stderrText(result)
        #expect(text.contains("lock order: ReadWriteLock"), "\(text)")
        #expect(text.contains("for reading again by the thread that holds it for reading"), "\(text)")
    }

    /// Readers and writers in one consistent order report nothing.
    @Test func readersAndWritersInOneOrderReportNothing() async {
        await #expect(processExitsWith: .success) {
            LockOrder.enable()
            let table = ReadWriteLock()
            let log = Spindle.Lock()
            runThreads(2) { i in
                for _ in 0..<1_000 {
                    if i == 0 { table.readLock() } else { table.writeLock() }
                    log.lock()
                    log.unlock()
                    if i == 0 { table.readUnlock() } else { table.writeUnlock() }
                }
            }
        }
    }

    @Test func aCycleThroughAsyncLocksIsReportedBeforeTheTaskSuspends() async {
        let result = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
            LockOrder.enable()
            let cache = AsyncLock()
            let store = AsyncLock()
            try await cache.lock()
            try await store.lock()
            store.unlock()
            cache.unlock()
            await Task.detached {
                try? await store.lock()
                try? await cache.lock()  // store -> cache closes the cycle
                cache.unlock()
                store.unlock()
            }.value
        }
        let text = stderrText(result)
        #expect(text.contains("lock order: acquiring AsyncLock"), "\(text)")
        #expect(text.contains("while holding AsyncLock"), "\(text)")
    }

    @Test func takingALockAgainOnTheHoldingThreadIsASelfDeadlock() async {
        let result = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
            LockOrder.enable()
            let table = ReadWriteLock()
            table.readLock()
            table.writeLock()
        }
        let text = stderrText(result)
        #expect(text.contains("lock order: ReadWriteLock"), "\(text)")
        #expect(text.contains("acquired again by the thread that holds it for reading"), "\(text)")
    }

    @Test func aConsistentOrderOverAMillionAcquisitionsReportsNothing() async {
        await #expect(processExitsWith: .success) {
            LockOrder.enable()
            let outer = Spindle.Lock()
            let middle = RecursiveLock()
            let inner = LockedValue(0)
            let condition = Condition()
            let spin = SpinLock()
            let account = Account()
            // 2 threads × 50,000 rounds × 11 acquisitions: over 10^6.
            runThreads(2) { _ in
                for _ in 0..<50_000 {
                    outer.lock()
                    middle.lock()
                    middle.lock()
                    inner.withLock { $0 += 1 }
                    condition.lock()
                    spin.lock()
                    spin.unlock()
                    condition.unlock()
                    _ = inner.withLockIfAvailable { $0 += 1 }
                    middle.unlock()
                    middle.unlock()
                    if spin.tryLock() { spin.unlock() }
                    outer.unlock()
                    if outer.lock(timeout: .seconds(60)) { outer.unlock() }
                    synchronized(account) { spin.lock(); spin.unlock() }
                }
            }
            check(inner.withLock { $0 } >= 100_000, "every round ran")
        }
    }

    /// Issue 39: a `Lock` taken again by its holder stops with a message
    /// naming the lock (a debug build looks without the checker).
    @Test func relockingALockOnItsHolderStopsWithTheLocksName() async {
        let result = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
            let lock = Spindle.Lock()
            lock.name = "cache"
            lock.lock()
            lock.lock()
        }
        let text = stderrText(result)
        #expect(text.contains("Lock \"cache\" is already held by the calling thread"), "\(text)")
    }

    @Test func theCheckerIsOffUnlessAskedFor() {
        // The test process runs without SPINDLE_LOCK_ORDER=1.
        #expect(!LockOrder.isEnabled)
    }
}

private final class Account: Sendable {}
private final class AuditLog: Sendable {}

private func stderrText(_ r: ExitTest.Result?) -> String {
    String(decoding: r?.standardErrorContent ?? [], as: UTF8.self)
}

/// A failed check inside a child process: stops it with the reason.
private func check(_ condition: Bool, _ message: String) {
    if !condition { fatalError(message) }
}
