// ThreadCosts: what creating a thread and keeping one parked cost, Spindle's
// NativeThread beside raw pthread_create and Foundation's Thread.
//
//   swift run -c release --package-path Bench ThreadCosts [creations]
//
// Rows: raw pthread_create with a pointer argument (the reference), the same
// with a Swift closure in a class box (the floor for any Swift wrapper),
// Spindle's NativeThread.start, and Foundation's Thread.start.
//
// 1. Start to entry: a timestamp (CLOCK_MONOTONIC) before the call that
//    starts the thread, and one taken first thing in its entry routine; the
//    Threading Programming Guide's "creation time" (Table 2-1).
// 2. Create and join: from before the start call until join returns
//    (Foundation's Thread cannot be joined: until its block has finished).
// 3. A parked thread's memory: its stack mapping's size (reserved address
//    space) and resident pages, read from /proc/self/smaps while 32 threads
//    of each kind sit in a futex wait; plus the system-wide KernelStack
//    delta from /proc/meminfo (kernel memory, noisy on a shared machine).
//
// The kinds are interleaved, one creation each per round in rotating
// order, so that drift in the machine's load hits all of them alike.
// Median and p99 over `creations` rounds (default 1,000).

import Foundation
import Spindle

#if canImport(Glibc)
import Glibc
#endif

let creations = CommandLine.arguments.dropFirst().first.flatMap { Int($0) } ?? 1_000

/// A word one thread sets and another spins on.
struct Slot: @unchecked Sendable {
    // @unchecked: only accessed through AtomicMemory.
    let word: UnsafeMutablePointer<Int64>
    init() {
        word = .allocate(capacity: 1)
        word.initialize(to: 0)
    }
    func reset() { AtomicMemory.store(0, to: word, ordering: .relaxed) }
    func set(_ value: Int64) { AtomicMemory.store(value, to: word, ordering: .releasing) }
    func await() -> Int64 {
        var spins = 0
        while true {
            let value = AtomicMemory.load(from: word, ordering: .acquiring)
            if value != 0 { return value }
            spins &+= 1
            if spins & 63 == 0 { sched_yield() } else { spinLoopHint() }
        }
    }
}

func now() -> Int64 { MonotonicClock.now.nanoseconds }

/// A procfs file's contents (their size is 0 to stat, so read to the end).
func readProcFile(_ path: String) -> String {
    let fd = open(path, O_RDONLY)
    guard fd >= 0 else { return "" }
    defer { close(fd) }
    var bytes: [UInt8] = []
    var chunk = [UInt8](repeating: 0, count: 65536)
    while true {
        let n = chunk.withUnsafeMutableBytes { read(fd, $0.baseAddress, $0.count) }
        if n <= 0 { break }
        bytes += chunk[0..<n]
    }
    return String(decoding: bytes, as: UTF8.self)
}

enum Kind: String, CaseIterable {
    case pthread = "pthread"
    case boxed = "pthread+closure box"
    case spindle = "Spindle NativeThread"
    case foundation = "Foundation.Thread"
}

func pthreadStampEntry(_ argument: UnsafeMutableRawPointer?) -> UnsafeMutableRawPointer? {
    AtomicMemory.store(now(), to: argument!.assumingMemoryBound(to: Int64.self), ordering: .releasing)
    return nil
}

final class ClosureBox {
    let body: () -> Void
    init(_ body: @escaping () -> Void) { self.body = body }
}

func boxedEntry(_ argument: UnsafeMutableRawPointer?) -> UnsafeMutableRawPointer? {
    let box = Unmanaged<ClosureBox>.fromOpaque(argument!).takeRetainedValue()
    box.body()
    return nil
}

func pthreadEmptyEntry(_ argument: UnsafeMutableRawPointer?) -> UnsafeMutableRawPointer? { nil }

/// Nanoseconds from the start call to the entry routine's first timestamp.
func startToEntry(_ kind: Kind, _ slot: Slot, _ done: Slot) -> Int64 {
    slot.reset()
    done.reset()
    switch kind {
    case .pthread:
        var thread = pthread_t()
        let t0 = now()
        let rc = pthread_create(&thread, nil, pthreadStampEntry, UnsafeMutableRawPointer(slot.word))
        precondition(rc == 0)
        let entered = slot.await()
        pthread_join(thread, nil)
        return entered - t0
    case .boxed:
        var thread = pthread_t()
        let t0 = now()
        let box = Unmanaged.passRetained(ClosureBox { slot.set(now()) }).toOpaque()
        let rc = pthread_create(&thread, nil, boxedEntry, box)
        precondition(rc == 0)
        let entered = slot.await()
        pthread_join(thread, nil)
        return entered - t0
    case .spindle:
        let t0 = now()
        let thread = try! NativeThread.start { slot.set(now()) }
        let entered = slot.await()
        try! thread.join()
        return entered - t0
    case .foundation:
        let t0 = now()
        Foundation.Thread {
            slot.set(now())
            done.set(1)
        }.start()
        let entered = slot.await()
        _ = done.await()
        return entered - t0
    }
}

/// Nanoseconds from the start call until the thread is joined.
func createAndJoin(_ kind: Kind, _ done: Slot) -> Int64 {
    done.reset()
    let t0 = now()
    switch kind {
    case .pthread:
        var thread = pthread_t()
        let rc = pthread_create(&thread, nil, pthreadEmptyEntry, nil)
        precondition(rc == 0)
        pthread_join(thread, nil)
    case .boxed:
        var thread = pthread_t()
        let box = Unmanaged.passRetained(ClosureBox { done.set(1) }).toOpaque()
        let rc = pthread_create(&thread, nil, boxedEntry, box)
        precondition(rc == 0)
        pthread_join(thread, nil)
    case .spindle:
        try! NativeThread.start {}.join()
    case .foundation:
        Foundation.Thread { done.set(1) }.start()
        _ = done.await()
    }
    return now() - t0
}

struct Summary {
    let median: Double
    let p99: Double
    let mean: Double
    init(_ samples: [Int64]) {
        let sorted = samples.sorted()
        let n = sorted.count
        median = Double(sorted[n / 2]) / 1000
        p99 = Double(sorted[min(n - 1, Int((Double(n) * 0.99).rounded(.up)) - 1)]) / 1000
        mean = Double(sorted.reduce(0, +)) / Double(n) / 1000
    }
}

func format(_ value: Double) -> String { String(format: "%7.1f", value) }

// MARK: Latency

let slot = Slot()
let done = Slot()
var entry: [Kind: [Int64]] = [:]
var join: [Kind: [Int64]] = [:]
// Warm-up: glibc's stack cache, the allocator, Foundation's thread machinery.
for kind in Kind.allCases {
    for _ in 0..<50 {
        _ = startToEntry(kind, slot, done)
        _ = createAndJoin(kind, done)
    }
}
let kinds = Kind.allCases
for round in 0..<creations {
    for offset in 0..<kinds.count {
        let kind = kinds[(round + offset) % kinds.count]
        entry[kind, default: []].append(startToEntry(kind, slot, done))
    }
    for offset in 0..<kinds.count {
        let kind = kinds[(round + offset) % kinds.count]
        join[kind, default: []].append(createAndJoin(kind, done))
    }
}

print("Thread creation, \(creations) creations of each kind, interleaved; µs")
print("")
for (title, data) in [("start to entry", entry), ("create and join", join)] {
    print("\(title.padding(toLength: 22, withPad: " ", startingAt: 0))  median      p99     mean   median ratio")
    let reference = Summary(data[.pthread]!).median
    for kind in kinds {
        let s = Summary(data[kind]!)
        let name = kind.rawValue.padding(toLength: 22, withPad: " ", startingAt: 0)
        print("\(name)  \(format(s.median))  \(format(s.p99))  \(format(s.mean))   \(String(format: "%.2f", s.median / reference))")
    }
    let spindle = Summary(data[.spindle]!).median
    let foundation = Summary(data[.foundation]!).median
    print("Spindle / pthread \(String(format: "%.3f", spindle / reference)), Spindle / Foundation \(String(format: "%.3f", spindle / foundation))")
    print("")
}

// MARK: Parked-thread memory

/// The stack mapping holding `address`: (size, resident) in bytes, from smaps.
func stackMapping(containing addresses: [UInt]) -> [(size: Int, resident: Int)] {
    let text = readProcFile("/proc/self/smaps")
    var mappings: [(start: UInt, end: UInt, size: Int, resident: Int)] = []
    for line in text.split(separator: "\n") {
        let fields = line.split(separator: " ", omittingEmptySubsequences: true)
        guard let first = fields.first else { continue }
        if first.contains("-"), !first.hasSuffix(":") {
            let bounds = first.split(separator: "-")
            if bounds.count == 2, let start = UInt(bounds[0], radix: 16), let end = UInt(bounds[1], radix: 16) {
                mappings.append((start, end, Int(end - start), 0))
            }
        } else if first == "Rss:", fields.count >= 2, let kb = Int(fields[1]), !mappings.isEmpty {
            mappings[mappings.count - 1].resident = kb * 1024
        }
    }
    return addresses.compactMap { address in
        mappings.first { $0.start <= address && address < $0.end }.map { ($0.size, $0.resident) }
    }
}

func kernelStackBytes() -> Int {
    let text = readProcFile("/proc/meminfo")
    for line in text.split(separator: "\n") where line.hasPrefix("KernelStack:") {
        let fields = line.split(separator: " ", omittingEmptySubsequences: true)
        return (Int(fields[1]) ?? 0) * 1024
    }
    return 0
}

/// Parks `count` threads of `kind`; returns their stack addresses and a
/// function that releases and reclaims them.
final class Park: @unchecked Sendable {
    // @unchecked: `word` only through AtomicMemory and Futex; `addresses`
    // is written by each thread into its own slot before it counts itself in.
    let word = UnsafeMutablePointer<UInt32>.allocate(capacity: 1)
    let parked = UnsafeMutablePointer<Int>.allocate(capacity: 1)
    let addresses: UnsafeMutablePointer<UInt>
    let count: Int
    init(_ count: Int) {
        self.count = count
        word.initialize(to: 0)
        parked.initialize(to: 0)
        addresses = .allocate(capacity: count)
        addresses.initialize(repeating: 0, count: count)
    }
    func body(_ index: Int) {
        var local = 0
        withUnsafeMutablePointer(to: &local) { addresses[index] = UInt(bitPattern: $0) }
        AtomicMemory.increment(parked, ordering: .releasing)
        let futex = Futex(word)
        while AtomicMemory.load(from: word, ordering: .acquiring) == 0 {
            _ = futex.wait(expecting: 0)
        }
    }
    func awaitParked() {
        while AtomicMemory.load(from: parked, ordering: .acquiring) < count { usleep(100) }
    }
    func release() {
        AtomicMemory.store(1, to: word, ordering: .releasing)
        Futex(word).wakeAll()
    }
}

func parkedPthreadEntry(_ argument: UnsafeMutableRawPointer?) -> UnsafeMutableRawPointer? {
    let pair = Unmanaged<ParkArgument>.fromOpaque(argument!).takeRetainedValue()
    pair.park.body(pair.index)
    return nil
}

final class ParkArgument {
    let park: Park
    let index: Int
    init(_ park: Park, _ index: Int) { self.park = park; self.index = index }
}

print("A parked thread's memory (32 threads of each kind in a futex wait), KiB per thread")
print("kind                    stack reserved  stack resident  KernelStack delta")
let parkedCount = 32
for kind in kinds {
    let park = Park(parkedCount)
    let kernelBefore = kernelStackBytes()
    var reclaim: [() -> Void] = []
    for i in 0..<parkedCount {
        switch kind {
        case .pthread, .boxed:
            var thread = pthread_t()
            let argument = Unmanaged.passRetained(ParkArgument(park, i)).toOpaque()
            precondition(pthread_create(&thread, nil, parkedPthreadEntry, argument) == 0)
            reclaim.append { pthread_join(thread, nil) }
        case .spindle:
            let thread = try! NativeThread.start { park.body(i) }
            reclaim.append { try! thread.join() }
        case .foundation:
            let done = Slot()
            Foundation.Thread {
                park.body(i)
                done.set(1)
            }.start()
            reclaim.append { _ = done.await() }
        }
    }
    park.awaitParked()
    let kernelAfter = kernelStackBytes()
    let stacks = stackMapping(containing: (0..<parkedCount).map { park.addresses[$0] })
    park.release()
    for step in reclaim { step() }
    let reserved = Double(stacks.map(\.size).reduce(0, +)) / Double(max(stacks.count, 1)) / 1024
    let resident = Double(stacks.map(\.resident).reduce(0, +)) / Double(max(stacks.count, 1)) / 1024
    let kernel = Double(kernelAfter - kernelBefore) / Double(parkedCount) / 1024
    print("\(kind.rawValue.padding(toLength: 22, withPad: " ", startingAt: 0))  \(String(format: "%14.0f", reserved))  \(String(format: "%14.1f", resident))  \(String(format: "%17.1f", kernel))")
}
print("(reserved: the stack mapping's size, guard page excluded; resident: its pages in RAM, including glibc's thread descriptor and static TLS at the top of the mapping)")
