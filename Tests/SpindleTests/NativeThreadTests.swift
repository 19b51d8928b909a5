import CShims
import Spindle
import Testing
import TestSupport

#if canImport(Glibc)
import Glibc
#endif

private struct BodyError: Error, Equatable {
    let code: Int
}

@Suite("NativeThread")
struct NativeThreadTests {
    // MARK: Starting and joining

    @Test func joinReturnsTheBodysResult() throws {
        let thread = try NativeThread.start { 6 * 7 }
        #expect(try thread.join() == 42)
        #expect(thread.isFinished)
    }

    @Test func explicitStartRunsNothingBeforeStart() throws {
        let ran = Latch()
        let thread = SpawnedThread { () -> String in
            ran.countDown()
            return "done"
        }
        #expect(thread.id == 0)
        #expect(!thread.isFinished)
        #expect(!ran.isOpen)
        try thread.start()
        #expect(thread.id > 0)
        #expect(try thread.join() == "done")
        #expect(ran.isOpen)
    }

    @Test func valuesOfEveryLayoutSurviveTheHandOff() throws {
        final class Tracked: Sendable {
            let released: Latch
            let tag: Int
            init(_ tag: Int, _ released: Latch) { self.tag = tag; self.released = released }
            deinit { released.countDown() }
        }
        struct Wide: Sendable, Equatable {
            var a = 1, b = 2, c = 3, d = 4, e = 5
        }
        // Inline (up to 16 bytes): String, Int8, a class reference, Void.
        #expect(try NativeThread.start { "a string longer than fifteen bytes" }.join() == "a string longer than fifteen bytes")
        #expect(try NativeThread.start { Int8(-3) }.join() == -3)
        #expect(try NativeThread.start { Optional<Int>.none }.join() == nil)
        try NativeThread.start {}.join()
        // Out of line: wider than 16 bytes.
        #expect(try NativeThread.start { Wide() }.join() == Wide())
        #expect(try NativeThread.start { [Wide(), Wide()] }.join().count == 2)

        let takenReleased = Latch()
        var taken: Tracked? = try NativeThread.start { Tracked(1, takenReleased) }.join()
        #expect(taken?.tag == 1)
        #expect(!takenReleased.isOpen, "the joiner owns the value")
        taken = nil
        #expect(takenReleased.isOpen)

        // Never joined, inline and out of line: released with the handle.
        let released = Latch(2)
        let unjoined = try NativeThread.start { Tracked(2, released) }
        let wide = try NativeThread.start { (Tracked(3, released), Wide()) }
        while !unjoined.isFinished || !wide.isFinished { NativeThread.yield() }
        _ = consume unjoined
        _ = consume wide
        #expect(released.wait(), "every value was released exactly once")
    }

    @Test func joinRethrowsTheBodysError() throws {
        let thread = try NativeThread.start { () throws -> Int in throw BodyError(code: 7) }
        #expect(throws: BodyError(code: 7)) { try thread.join() }
    }

    @Test func joinUntilReturnsNilWhileRunningThenJoins() throws {
        let release = Latch()
        let thread = try NativeThread.start { () -> Int in
            release.wait()
            return 5
        }
        #expect(try thread.join(until: .now) == nil)
        #expect(try thread.join(until: MonotonicClock.now.advanced(by: .milliseconds(5))) == nil)
        release.countDown()
        #expect(try thread.join(until: MonotonicClock.now.advanced(by: .seconds(30))) == 5)
    }

    @Test func detachedThreadsErrorGoesToItsHandler() throws {
        let reported = Latch()
        let seen = UnsafeBox<(BodyError?, Int32)>((nil, 0))
        let attributes = NativeThread.Attributes(onDetachedError: { error, thread in
            seen.value = (error as? BodyError, thread.id)
            reported.countDown()
        })
        let thread = try NativeThread.detach(attributes) { throw BodyError(code: 3) }
        #expect(reported.wait())
        #expect(seen.value.0 == BodyError(code: 3))
        #expect(seen.value.1 == thread.id)
    }

    @Test func detachedThreadsErrorWithoutHandlerIsWrittenToStandardError() async {
        let result = await #expect(processExitsWith: .success, observing: [\.standardErrorContent]) {
            let exited = Latch()
            // Destructors run after the error report, as the thread exits.
            let marker = ThreadLocal<Int>(onThreadExit: { _ in exited.countDown() })
            try! NativeThread.detach(NativeThread.Attributes(name: "reporter")) {
                marker.value = 1
                throw BodyError(code: 11)
            }
            exit(exited.wait() ? 0 : 1)
        }
        let stderr = String(decoding: result?.standardErrorContent ?? [], as: UTF8.self)
        #expect(stderr.contains("\"reporter\""))
        #expect(stderr.contains("is detached, and its body threw: BodyError(code: 11)"))
    }

    @Test func releasingAnUnjoinedThreadReportsItsError() async {
        let result = await #expect(processExitsWith: .success, observing: [\.standardErrorContent]) {
            var thread: SpawnedThread<Int>? = SpawnedThread(NativeThread.Attributes(name: "dropped")) { () throws -> Int in
                throw BodyError(code: 9)
            }
            try! thread!.start()
            // Wait until the body is done and the thread has given up its
            // reference, so that the release below is the last one and the
            // report is written before this process exits.
            while !thread!.isFinished || !isKnownUniquelyReferenced(&thread!) { usleep(100) }
            thread = nil
            exit(0)
        }
        let stderr = String(decoding: result?.standardErrorContent ?? [], as: UTF8.self)
        #expect(stderr.contains("\"dropped\" was released without a join, and its body threw: BodyError(code: 9)"))
    }

    // MARK: Identity

    @Test func currentInsideTheBodyIsTheSpawnedThread() throws {
        let thread = try NativeThread.start { ObjectIdentifier(NativeThread.current) }
        #expect(try thread.join() == ObjectIdentifier(thread))
    }

    @Test func idIsTheKernelThreadID() throws {
        let thread = try NativeThread.start { () -> (Int32, Int32) in
            (cshims_gettid(), NativeThread.current.id)
        }
        let (kernel, own) = try thread.join()
        #expect(kernel == own)
        #expect(thread.id == kernel)
    }

    @Test func threadsNotCreatedBySpindleAreRegisteredOnFirstUse() {
        let seen = UnsafeBox<(Int32, Int32, Bool, Bool)>((0, 0, false, true))
        runThreads(1) { _ in
            let first = NativeThread.current
            seen.value = (first.id, cshims_gettid(), first === NativeThread.current, first.isMainThread)
        }
        #expect(seen.value.0 == seen.value.1)
        #expect(seen.value.2, "current returns the same object on every call")
        #expect(!seen.value.3)
    }

    @Test func mainThreadIsTheProcessID() {
        #expect(NativeThread.main.id == getpid())
        #expect(NativeThread.main.isMainThread)
        #expect(NativeThread.isMainThread == (cshims_gettid() == getpid()))
        let onOther = UnsafeBox(true)
        runThreads(1) { _ in onOther.value = NativeThread.isMainThread }
        #expect(!onOther.value)
    }

    // MARK: Names

    @Test func nameIsAppliedBeforeTheBodyRuns() throws {
        let running = Latch()
        let release = Latch()
        let thread = try NativeThread.start(NativeThread.Attributes(name: "spindle-worker")) { () -> String? in
            running.countDown()
            release.wait()
            return NativeThread.current.name
        }
        running.wait()
        #expect(thread.name == "spindle-worker", "read from /proc by another thread")
        release.countDown()
        #expect(try thread.join() == "spindle-worker")
        #expect(thread.name == "spindle-worker", "the creation name once it has exited")
    }

    @Test func fifteenBytesIsTheLongestName() throws {
        let fifteen = "abcdefghijklmno"
        let thread = try NativeThread.start(NativeThread.Attributes(name: fifteen)) { NativeThread.current.name }
        #expect(try thread.join() == fifteen)
    }

    @Test func longerNamesAreAnErrorNotACut() {
        #expect(throws: NativeThreadError.nameTooLong(bytes: 16, limit: 15)) {
            _ = try NativeThread.start(NativeThread.Attributes(name: "abcdefghijklmnop")) {}
        }
        // Bytes of UTF-8, not characters: nine "é" are 18 bytes.
        #expect(throws: NativeThreadError.nameTooLong(bytes: 18, limit: 15)) {
            try NativeThread.Attributes(name: String(repeating: "é", count: 9)).validate()
        }
        #expect(throws: NativeThreadError.nameContainsNUL) {
            try NativeThread.Attributes(name: "a\u{0}b").validate()
        }
    }

    @Test func aThreadCanRenameItself() throws {
        let thread = try NativeThread.start { () throws -> String? in
            try NativeThread.current.setName("renamed")
            return NativeThread.current.name
        }
        #expect(try thread.join() == "renamed")
        let tooLong = try NativeThread.start { () -> NativeThreadError? in
            do throws(NativeThreadError) {
                try NativeThread.current.setName(String(repeating: "x", count: 40))
                return nil
            } catch {
                return error
            }
        }
        #expect(try tooLong.join() == .nameTooLong(bytes: 40, limit: 15))
    }

    /// `name` right after `start()` used to read the process's name in 299 of
    /// 300 starts: the thread had not run yet to name itself.
    @Test func nameIsTheCreationNameFromTheMomentStartReturns() throws {
        for round in 0..<100 {
            let release = Latch()
            let thread = SpawnedThread(NativeThread.Attributes(name: "named-\(round % 10)")) {
                _ = release.wait()
            }
            try thread.start()
            #expect(thread.name == "named-\(round % 10)")
            release.countDown()
            try thread.join()
        }
    }

    // MARK: Attributes

    @Test func badStackSizesThrowSpecificErrors() {
        #expect(throws: NativeThreadError.stackSizeTooSmall(requested: 1, minimum: Topology.minimumStackSize)) {
            _ = try NativeThread.start(NativeThread.Attributes(stackSize: 1)) {}
        }
        let notAPageMultiple = Topology.minimumStackSize + 1
        #expect(throws: NativeThreadError.stackSizeNotPageMultiple(requested: notAPageMultiple, pageSize: Topology.pageSize)) {
            _ = try NativeThread.start(NativeThread.Attributes(stackSize: notAPageMultiple)) {}
        }
    }

    /// Stacks of 16 and 20 KiB passed validation and then crashed with
    /// SIGSEGV in Spindle's own exit path; now they are refused, and a stack
    /// of exactly the minimum runs a body that allocates, locks and leaves
    /// thread-local values for the exit duties. In a child process, so that
    /// it is the process's first thread to exit (the deepest exit path).
    @Test func aStackOfExactlyTheMinimumRunsAllocatesLocksAndExits() async {
        for small in [16 << 10, 20 << 10] where small < Topology.minimumStackSize {
            #expect(throws: NativeThreadError.stackSizeTooSmall(requested: small, minimum: Topology.minimumStackSize)) {
                _ = try NativeThread.start(NativeThread.Attributes(stackSize: small)) {}
            }
        }
        await #expect(processExitsWith: .success) {
            let local = ThreadLocal<[Int]>()
            let lock = Lock()
            let attributes = NativeThread.Attributes(name: "minimum", stackSize: Topology.minimumStackSize)
            let thread = try! NativeThread.start(attributes) { () -> Int in
                var array = [Int](repeating: 1, count: 1_000)
                lock.withLock { array[3] = 7 }
                local.value = array
                NativeThread.current.threadDictionary["key"] = "value"
                return array.reduce(0, +)
            }
            guard (try? await thread.join()) == 1_006 else { exit(1) }
            exit(0)
        }
    }

    @Test func stackSizeIsHonoured() throws {
        let size = 256 << 10
        let thread = try NativeThread.start(NativeThread.Attributes(stackSize: size)) { () -> Int in
            var base: UnsafeMutableRawPointer? = nil
            var actual = 0
            _ = cshims_thread_stack_self(&base, &actual)
            return actual
        }
        #expect(try thread.join() == size)
    }

    @Test func affinityOutsideTheOnlineCPUsThrows() {
        #expect(throws: NativeThreadError.cpuOutOfRange(cpu: 4096, online: Topology.onlineCPUs)) {
            _ = try NativeThread.start(NativeThread.Attributes(affinity: [4096])) {}
        }
        #expect(throws: NativeThreadError.cpuOutOfRange(cpu: -1, online: Topology.onlineCPUs)) {
            try NativeThread.Attributes(affinity: [-1]).validate()
        }
        #expect(throws: NativeThreadError.emptyCPUSet) {
            try NativeThread.Attributes(affinity: []).validate()
        }
    }

    @Test func affinityIsAppliedAtCreation() throws {
        let cpu = Topology.onlineCPUs.last!
        let thread = try NativeThread.start(NativeThread.Attributes(affinity: [cpu])) { () throws -> (Set<Int>, Int?) in
            (try NativeThread.current.affinity(), Topology.currentCPU)
        }
        let (affinity, running) = try thread.join()
        #expect(affinity == [cpu])
        #expect(running == cpu)
    }

    @Test func aThreadCanPinItselfAndBeRepinnedFromOutside() throws {
        let first = Topology.onlineCPUs.first!
        let last = Topology.onlineCPUs.last!
        let pinned = Latch()
        let release = Latch()
        let thread = try NativeThread.start { () throws -> Set<Int> in
            try NativeThread.current.setAffinity([first])
            pinned.countDown()
            release.wait()
            return try NativeThread.current.affinity()
        }
        pinned.wait()
        #expect(try thread.affinity() == [first])
        try thread.setAffinity([last])
        release.countDown()
        #expect(try thread.join() == [last])
        #expect(throws: NativeThreadError.threadExited(id: thread.id)) { try thread.affinity() }
    }

    @Test func numaNodeThatDoesNotExistThrows() {
        #expect(throws: NativeThreadError.numaNodeOutOfRange(node: 7, available: Topology.numaNodeIDs)) {
            _ = try NativeThread.start(NativeThread.Attributes(numaNode: 7)) {}
        }
    }

    @Test func nodeZeroRunsOnItsCPUs() throws {
        let node = Topology.numaNodes.first { $0.id == 0 }!
        let thread = try NativeThread.start(NativeThread.Attributes(numaNode: 0)) { () throws -> Set<Int> in
            try NativeThread.current.affinity()
        }
        #expect(try thread.join() == Set(node.cpus))
    }

    @Test func relativePriorityMapsOntoNice() throws {
        let thread = try NativeThread.start(NativeThread.Attributes(priority: .relative(0.0))) { () throws -> (Int32, NativeThread.Priority) in
            errno = 0
            let nice = getpriority(__priority_which_t(PRIO_PROCESS.rawValue), 0)
            return (nice, try NativeThread.current.priority())
        }
        let (nice, priority) = try thread.join()
        #expect(nice == 19)
        #expect(priority == .relative(0.0))
        let lowered = try NativeThread.start { () throws -> NativeThread.Priority in
            try NativeThread.current.setPriority(.relative(0.25))
            return try NativeThread.current.priority()
        }
        // 0.25 is nice 10 (rounded from 9.5), which reads back as 0.5 - 10/38.
        #expect(try lowered.join() == .relative(0.5 - 10.0 / 38))
    }

    @Test func priorityValuesOutOfRangeThrow() {
        #expect(throws: NativeThreadError.priorityOutOfRange(1.5)) {
            try NativeThread.Attributes(priority: .relative(1.5)).validate()
        }
        #expect(throws: NativeThreadError.realtimePriorityOutOfRange(requested: 0, allowed: 1...99)) {
            try NativeThread.Attributes(priority: .fifo(0)).validate()
        }
        #expect(throws: NativeThreadError.realtimePriorityOutOfRange(requested: 100, allowed: 1...99)) {
            try NativeThread.Attributes(priority: .roundRobin(100)).validate()
        }
    }

    @Test func realtimePolicyRunsOrIsRefusedWithPermissionDenied() throws {
        let thread: SpawnedThread<NativeThread.Priority>
        do throws(NativeThreadError) {
            thread = try NativeThread.start(NativeThread.Attributes(priority: .fifo(1))) { () throws -> NativeThread.Priority in
                try NativeThread.current.priority()
            }
        } catch {
            guard case .permissionDenied = error else {
                Issue.record("expected permissionDenied, got \(error)")
                return
            }
            return
        }
        #expect(try thread.join() == .fifo(1))
    }

    @Test func unprivilegedRealtimeAndRaisedPriorityThrowPermissionDenied() async {
        _ = await #expect(processExitsWith: .success) {
            // Drop root (and with it CAP_SYS_NICE) if we have it; RLIMIT_RTPRIO
            // and RLIMIT_NICE of 0 then refuse both requests.
            if getuid() == 0 && setuid(65534) != 0 { exit(2) }
            var limit = rlimit(rlim_cur: 0, rlim_max: 0)
            // RLIMIT_NICE is 13 and RLIMIT_RTPRIO 14 in Linux's ABI; glibc
            // declares them only for _GNU_SOURCE.
            setrlimit(__rlimit_resource_t(13), &limit)
            setrlimit(__rlimit_resource_t(14), &limit)
            for priority in [NativeThread.Priority.fifo(10), .roundRobin(10), .relative(1.0)] {
                do throws(NativeThreadError) {
                    let thread = try NativeThread.start(NativeThread.Attributes(priority: priority)) {}
                    _ = try? await thread.join()
                    exit(3)
                } catch {
                    guard case .permissionDenied = error else { exit(4) }
                }
            }
            exit(0)
        }
    }

    // MARK: State: isExecuting, isFinished

    @Test func aSpawnedThreadExecutesFromStartUntilItsBodyAndExitDutiesEnd() throws {
        let release = Latch()
        let inside = UnsafeBox<(Bool, Bool)>((false, true))
        let thread = SpawnedThread { () -> Int in
            inside.value = (NativeThread.current.isExecuting, NativeThread.current.isFinished)
            _ = release.wait()
            return 1
        }
        #expect(!thread.isExecuting, "not started yet")
        #expect(!thread.isFinished)
        try thread.start()
        #expect(thread.isExecuting)
        #expect(!thread.isFinished)
        release.countDown()
        #expect(try thread.join() == 1)
        #expect(inside.value == (true, false), "the body sees itself executing")
        #expect(!thread.isExecuting)
        #expect(thread.isFinished)
    }

    @Test func aForeignThreadExecutesWhileRegisteredAndFinishesAfterItsExitDuties() {
        let seen = UnsafeBox<(NativeThread?, Bool, Bool)>((nil, false, true))
        let finishedDuringDuties = UnsafeBox<Bool?>(nil)
        // Its destructor runs among the exit duties: not finished yet.
        let local = ThreadLocal<NativeThread> { me in finishedDuringDuties.value = me.isFinished }
        runThreads(1) { _ in
            let me = NativeThread.current
            seen.value = (me, me.isExecuting, me.isFinished)
            local.value = me
        }
        let thread = seen.value.0!
        #expect(seen.value.1, "executing once registered")
        #expect(!seen.value.2)
        #expect(finishedDuringDuties.value == false, "finished only once its exit duties have run")
        #expect(thread.isFinished, "pthread_join waits for the key destructor")
        #expect(!thread.isExecuting)
        // Cancelling a finished foreign thread does nothing more than set the flag.
        thread.cancel()
        #expect(thread.isCancelled)
    }

    @Test func theMainThreadIsAlwaysExecuting() {
        #expect(NativeThread.main.isExecuting)
        #expect(!NativeThread.main.isFinished)
        let fromOther = UnsafeBox((false, true))
        runThreads(1) { _ in fromOther.value = (NativeThread.main.isExecuting, NativeThread.main.isFinished) }
        #expect(fromOther.value == (true, false))
    }

    @Test func foreignAndMainThreadsCanBeCancelledFromAnyThread() async {
        // The main thread's flag is process-wide state: in a child process.
        await #expect(processExitsWith: .success) {
            let worker = UnsafeBox<NativeThread?>(nil)
            let registered = Latch()
            let cancelled = Latch()
            let sawCancel = UnsafeBox(false)
            let join = startThread {
                worker.value = NativeThread.current
                registered.countDown()
                _ = cancelled.wait()
                sawCancel.value = NativeThread.current.isCancelled
                // The main thread's cancellation, set from here.
                NativeThread.main.cancel()
            }
            _ = registered.wait()
            #expect(!worker.value!.isCancelled)
            worker.value!.cancel()
            cancelled.countDown()
            join()
            #expect(sawCancel.value)
            // (The exit test's body need not run on the child's main thread.)
            #expect(NativeThread.main.isCancelled)
        }
    }

    // MARK: Cancellation and sleep

    @Test func cancelWakesASleepingThread() throws {
        let sleeping = Latch()
        let thread = try NativeThread.start { () -> (Bool, Bool) in
            sleeping.countDown()
            let slept = NativeThread.sleep(for: .seconds(600))
            return (slept, NativeThread.current.isCancelled)
        }
        sleeping.wait()
        #expect(!thread.isCancelled)
        thread.cancel()
        #expect(thread.isCancelled)
        let (slept, cancelled) = try thread.join()
        #expect(!slept)
        #expect(cancelled)
    }

    @Test func aCancelledThreadDoesNotSleep() throws {
        let thread = SpawnedThread { () -> Bool in NativeThread.sleep(for: .seconds(600)) }
        thread.cancel()
        try thread.start()
        #expect(try thread.join() == false)
    }

    @Test func sleepLastsAtLeastItsDuration() throws {
        let thread = try NativeThread.start { () -> (Bool, Duration) in
            let start = MonotonicClock.now
            let slept = NativeThread.sleep(for: .milliseconds(20))
            return (slept, start.duration(to: MonotonicClock.now))
        }
        let (slept, elapsed) = try thread.join()
        #expect(slept)
        #expect(elapsed >= .milliseconds(20))
        #expect(NativeThread.sleep(for: .zero))
    }

    // MARK: Thread dictionary

    @Test func threadDictionaryIsPerThreadAndReleasedAtExit() throws {
        final class Tracked: @unchecked Sendable {
            let released: Latch
            init(_ released: Latch) { self.released = released }
            deinit { released.countDown() }
        }
        let released = Latch(2)
        let threads = try (0..<2).map { index in
            try NativeThread.start { () -> (Int?, Int) in
                let dictionary = NativeThread.current.threadDictionary
                dictionary["index"] = index
                dictionary["tracked"] = Tracked(released)
                return (NativeThread.current.threadDictionary.value(forKey: "index", as: Int.self), dictionary.count)
            }
        }
        for (index, thread) in threads.enumerated() {
            let (seen, count) = try thread.join()
            #expect(seen == index)
            #expect(count == 2)
        }
        #expect(released.wait(seconds: 0), "dictionary values are released before join returns")
    }

    // MARK: Leaks

    @Test func tenThousandThreadsLeakNeitherTasksNorMemory() async {
        let result = await #expect(processExitsWith: .success, observing: [\.standardErrorContent]) {
            func round(_ count: Int) {
                for i in 0..<count {
                    let thread = try! NativeThread.start { i &* 3 }
                    if try! thread.join() != i &* 3 { exit(5) }
                }
            }
            round(200)  // warm up glibc's stack cache and the allocator
            let tasks = processThreadCount()
            let resident = residentBytes()
            round(10_000)
            let grown = residentBytes() - resident
            // A joined thread's task can linger in /proc for a moment while
            // the kernel reaps it; other threads of the test process may come
            // and go, so the count must come back to the baseline or below.
            var after = processThreadCount()
            for _ in 0..<2000 where after > tasks {
                usleep(1000)
                after = processThreadCount()
            }
            let message = "tasks \(tasks) -> \(after), resident +\(grown / 1024) KiB\n"
            _ = message.withCString { write(2, $0, strlen($0)) }
            exit(after <= tasks && grown < 8 << 20 ? 0 : 1)
        }
        let stderr = String(decoding: result?.standardErrorContent ?? [], as: UTF8.self)
        #expect(stderr.contains("tasks"), "the child reports its counts")
    }
}

/// Misuse stops the process with a message naming the mistake.
@Suite("NativeThread misuse")
struct NativeThreadMisuseTests {
    private static func stderr(_ result: ExitTest.Result?) -> String {
        String(decoding: result?.standardErrorContent ?? [], as: UTF8.self)
    }

    @Test func startingTwice() async {
        let result = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
            let thread = SpawnedThread {}
            try! thread.start()
            try! thread.start()
        }
        #expect(Self.stderr(result).contains("was already started; a thread runs its body once"))
    }

    @Test func joiningTwice() async {
        let result = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
            let thread = try! NativeThread.start {}
            try! await thread.join()
            try! await thread.join()
        }
        #expect(Self.stderr(result).contains("was already joined"))
    }

    @Test func joiningADetachedThread() async {
        let result = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
            let thread = SpawnedThread(NativeThread.Attributes(isDetached: true)) {}
            try! thread.start()
            _ = try? await thread.join()
        }
        #expect(Self.stderr(result).contains("is detached; a detached thread cannot be joined"))
    }

    @Test func joiningAThreadNeverStarted() async {
        let result = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
            let thread = SpawnedThread {}
            _ = try? await thread.join()
        }
        #expect(Self.stderr(result).contains("was never started; call start() first"))
    }

    @Test func joiningYourself() async {
        let result = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
            let handle = UnsafeBox<SpawnedThread<Void>?>(nil)
            let ready = Latch()
            let thread = SpawnedThread {
                ready.wait()
                try? handle.value!.join()
            }
            handle.value = thread
            try! thread.start()
            ready.countDown()
            blocking { NativeThread.sleep(for: .seconds(30)) }
        }
        #expect(Self.stderr(result).contains("is trying to join itself"))
    }

    @Test func renamingAnotherThread() async {
        let result = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
            let release = Latch()
            let thread = try! NativeThread.start { release.wait() }
            try? thread.setName("other")
        }
        #expect(Self.stderr(result).contains("NativeThread.setName(_:): called on"))
        #expect(Self.stderr(result).contains("only a thread itself may do this"))
    }

    @Test func reachingForAnotherThreadsDictionary() async {
        let result = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
            let release = Latch()
            let thread = try! NativeThread.start { release.wait() }
            _ = thread.threadDictionary
        }
        #expect(Self.stderr(result).contains("NativeThread.threadDictionary: called on"))
    }
}
