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
