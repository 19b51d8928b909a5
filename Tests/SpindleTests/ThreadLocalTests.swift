import Spindle
import Testing
import TestSupport

#if canImport(Glibc)
import Glibc
#endif

/// Counts calls from any thread.
private final class Counter: @unchecked Sendable {
    // @unchecked: the word is only accessed through AtomicMemory.
    let word = UnsafeMutablePointer<Int>.allocate(capacity: 1)
    init() { word.initialize(to: 0) }
    deinit { word.deallocate() }
    func add(_ n: Int = 1) { AtomicMemory.add(n, to: word, ordering: .sequentiallyConsistent) }
    var value: Int { AtomicMemory.load(from: word, ordering: .sequentiallyConsistent) }
}

@Suite("ThreadLocal")
struct ThreadLocalTests {
    @Test func eachThreadHasItsOwnValue() throws {
        let local = ThreadLocal<Int>()
        #expect(local.value == nil)
        let threads = try (0..<4).map { index in
            try NativeThread.start { () -> (Int?, Int?) in
                let before = local.value
                local.value = index
                NativeThread.yield()
                return (before, local.value)
            }
        }
        for (index, thread) in threads.enumerated() {
            let (before, after) = try thread.join()
            #expect(before == nil)
            #expect(after == index)
        }
        #expect(local.value == nil, "the test's thread never stored one")
    }

    @Test func destructorRunsOncePerThreadBeforeJoinReturns() throws {
        let destroyed = Counter()
        let sum = Counter()
        let local = ThreadLocal<Int>(onThreadExit: { value in
            destroyed.add()
            sum.add(value)
        })
        let threads = try (1...8).map { index in
            try NativeThread.start { local.value = index }
        }
        for thread in threads { try thread.join() }
        #expect(destroyed.value == 8)
        #expect(sum.value == 36)
    }

    @Test func destructorRunsOnThreadsSpindleDidNotCreate() {
        let destroyed = Counter()
        let local = ThreadLocal<String>(onThreadExit: { _ in destroyed.add() })
        runThreads(3) { index in local.value = "thread \(index)" }
        #expect(destroyed.value == 3)
    }

    @Test func replacingOrRemovingDoesNotCallTheDestructor() throws {
        let destroyed = Counter()
        let local = ThreadLocal<Int>(onThreadExit: { _ in destroyed.add() })
        let thread = try NativeThread.start { () -> Int? in
            local.value = 1
            local.value = 2
            let removed = local.removeValue()
            local.value = nil
            return removed
        }
        #expect(try thread.join() == 2)
        #expect(destroyed.value == 0)
    }

    @Test func valueOrInsertMakesTheValueOnce() throws {
        let made = Counter()
        let local = ThreadLocal<[Int]>()
        let thread = try NativeThread.start { () -> [Int] in
            for _ in 0..<3 {
                _ = local.value(orInsert: {
                    made.add()
                    return [1]
                })
            }
            local.withValue { $0?.append(2) }
            local.withValue { $0!.append(3) }
            return local.value ?? []
        }
        #expect(try thread.join() == [1, 2, 3])
        #expect(made.value == 1)
    }

    @Test func destructorsMayStoreValuesWhichAreDestroyedToo() throws {
        let order = UnsafeBox<[String]>([])
        let second = ThreadLocal<String>(onThreadExit: { order.value.append($0) })
        let first = ThreadLocal<String>(onThreadExit: { value in
            order.value.append(value)
            second.value = "stored by a destructor"
        })
        let later = ThreadLocal<String>(onThreadExit: { order.value.append($0) })
        let thread = try NativeThread.start {
            first.value = "first"
            later.value = "later"
        }
        try thread.join()
        // Reverse order of creation, then a second round for the new value.
        #expect(order.value == ["later", "first", "stored by a destructor"])
    }

    @Test func destructorSeesTheExitingThreadAsCurrent() throws {
        let seen = UnsafeBox<Int32>(0)
        let local = ThreadLocal<Int>(onThreadExit: { _ in seen.value = NativeThread.current.id })
        let thread = try NativeThread.start { local.value = 1 }
        try thread.join()
        #expect(seen.value == thread.id)
    }
}
