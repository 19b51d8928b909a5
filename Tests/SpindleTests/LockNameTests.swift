import Spindle
import Testing
import TestSupport

/// `name` on the locks, conditions and semaphores (Foundation's `NSLock.name`).
@Suite("Lock names")
struct LockNameTests {
    @Test func aNameIsSharedByEveryCopyAndShownInTheDescription() {
        let lock = Lock()
        #expect(lock.name == nil)
        #expect(lock.description == "Lock(unlocked)", "unnamed: as before")
        let copy = lock
        copy.name = "db"
        #expect(lock.name == "db")
        lock.lock()
        #expect(lock.description == "Lock(\"db\", locked)")
        lock.unlock()
        lock.name = nil
        #expect(copy.name == nil)
        #expect(copy.description == "Lock(unlocked)")
    }

    @Test func everyKindTakesAName() {
        let recursive = RecursiveLock()
        recursive.name = "tree"
        #expect(recursive.description == "RecursiveLock(\"tree\", unlocked)")
        let condition = Condition()
        condition.name = "mailbox"
        #expect(condition.name == "mailbox")
        #expect(condition.description == "Condition(\"mailbox\", unlocked)")
        let conditionLock = ConditionLock(condition: 2)
        conditionLock.name = "stage"
        #expect(conditionLock.description == "ConditionLock(\"stage\", unlocked, condition: 2)")
        let semaphore = Semaphore(value: 3)
        semaphore.name = "slots"
        #expect(semaphore.description == "Semaphore(\"slots\", value: 3)")
        #expect(Semaphore(value: 1).description == "Semaphore(value: 1)")
    }

    @Test func aNewLockNeverInheritsTheNameOfOneReleasedBeforeIt() {
        // The storage's deinit drops its entry: an address reused by a later
        // lock starts unnamed.
        for round in 0..<1_000 {
            let lock = Lock()
            #expect(lock.name == nil, "round \(round)")
            lock.name = "round \(round)"
            let condition = Condition()
            #expect(condition.name == nil, "round \(round)")
            condition.name = "round \(round)"
        }
    }

    @Test func namesAreReadableAndSettableFromManyThreads() {
        let lock = Lock()
        runThreads(4) { i in
            for j in 0..<200 {
                lock.name = "\(i).\(j)"
                _ = lock.name
                lock.withLock {}
            }
        }
        #expect(lock.name?.hasSuffix(".199") == true)
    }

    // MARK: Misuse messages name the lock

    @Test func recursiveLockMisuseNamesTheLock() async {
        let r = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
            let lock = RecursiveLock()
            lock.name = "tree"
            lock.unlock()
        }
        #expect(errorText(r).contains("RecursiveLock \"tree\".unlock(): the calling thread does not hold this lock"))
    }

    @Test func lockMisuseNamesTheLock() async {
        let r = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
            let lock = Lock()
            lock.name = "db"
            lock.unlock()
        }
        #expect(errorText(r).contains("unlock(): the lock \"db\" is not locked"))
    }

    @Test func conditionMisuseNamesTheCondition() async {
        let r = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
            let condition = Condition()
            condition.name = "mailbox"
            _ = blocking { condition.wait(timeout: .seconds(1)) }
        }
        #expect(errorText(r).contains("Condition \"mailbox\".wait: the condition is not locked"))
    }

    @Test func conditionLockMisuseNamesTheLock() async {
        let r = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
            let lock = ConditionLock()
            lock.name = "stage"
            lock.unlock()
        }
        #expect(errorText(r).contains("ConditionLock \"stage\".unlock"))
        #expect(errorText(r).contains("the lock is not locked"))
    }
}

private func errorText(_ result: ExitTest.Result?) -> String {
    result.map { String(decoding: $0.standardErrorContent, as: UTF8.self) } ?? ""
}

#if canImport(Glibc)
import Glibc
#endif

@Suite("Lock names across fork")
struct LockNameForkTests {
    /// A thread names and frees locks without pause (each takes the name
    /// table's lock) while the main thread forks 200 times; every child
    /// names and frees a lock of its own and exits promptly, even one
    /// forked while that thread held the table's lock: the child starts
    /// from an empty table (the parent's names are not the child's).
    @Test func childrenForkedWhileAThreadNamesLocksNameTheirOwnAndExit() async {
        await #expect(processExitsWith: .success) {
            exit(forkWhileNamingLocks(children: 200))
        }
    }
}

private func forkWhileNamingLocks(children: Int) -> Int32 {
    let stop = LockedValue(false)
    let kept = Lock()
    kept.name = "kept"
    guard let namer = try? NativeThread.start({
        var i = 0
        while !stop.withLock({ $0 }) {
            let lock = Lock()
            lock.name = "hammered-\(i)"
            i += 1
        }
    }) else { return 2 }
    var code: Int32 = 0
    for _ in 0..<children {
        let child = fork()
        if child == 0 {
            armHangAlarm(seconds: 20)
            do {
                let mine = Lock()
                mine.name = "child"
                guard mine.name == "child" else { _exit(3) }
                guard kept.name == nil else { _exit(6) }
            }
            _exit(0)
        }
        guard child > 0 else {
            code = 4
            break
        }
        var status: Int32 = 0
        guard waitpid(child, &status, 0) == child else {
            code = 5
            break
        }
        if status != 0 {
            // A child killed by SIGALRM (status 14) hung.
            code = 10 + min((status & 0x7f) != 0 ? status & 0x7f : (status >> 8) & 0xff, 100)
            break
        }
    }
    stop.withLock { $0 = true }
    try? namer.join()
    return code
}
