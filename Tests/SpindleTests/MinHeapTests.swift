// The timer heaps' structure (`MinHeap`): pushes, pops, removals at the
// index an element was last told, and `keepOnly` (which a forked child runs
// first thing, in place), checked against a sorted model, with every
// element's recorded index kept true.
@testable import Spindle
import Testing

/// An element that remembers where the heap put it (-1: out of it).
private final class Entry: HeapOrdered {
    let key: Int
    let id: Int
    var index = -1

    init(key: Int, id: Int) {
        self.key = key
        self.id = id
    }

    func isBefore(_ other: Entry) -> Bool {
        key != other.key ? key < other.key : id < other.id
    }

    func placed(at index: Int) { self.index = index }
}

/// A small deterministic generator (SplitMix64), for repeatable runs.
private struct SplitMix {
    var state: UInt64

    mutating func next(_ bound: Int) -> Int {
        state &+= 0x9E37_79B9_7F4A_7C15
        var z = state
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return Int((z ^ (z >> 31)) % UInt64(bound))
    }
}

@Suite("MinHeap")
struct MinHeapTests {
    /// 20,000 random operations on a heap beside a model (the elements in
    /// it): after each, the first element is the model's least, every
    /// element in the heap knows its index, and every element out of it
    /// knows it is out.
    @Test(arguments: [1, 2, 3])
    func randomOperationsKeepTheOrderAndTheIndices(seed: UInt64) {
        var random = SplitMix(state: seed)
        var heap = MinHeap<Entry>()
        var inHeap: [Entry] = []
        var removed: [Entry] = []
        var nextID = 0
        for step in 0..<20_000 {
            switch random.next(10) {
            case 0..<5:
                let entry = Entry(key: random.next(100), id: nextID)
                nextID += 1
                heap.push(entry)
                inHeap.append(entry)
            case 5, 6:
                guard !inHeap.isEmpty else { continue }
                let first = heap.popFirst()
                let least = inHeap.min { $0.isBefore($1) }!
                #expect(first === least, "step \(step): popped \(first.key)/\(first.id), least is \(least.key)/\(least.id)")
                inHeap.removeAll { $0 === first }
                removed.append(first)
            case 7, 8:
                guard !inHeap.isEmpty else { continue }
                let victim = inHeap[random.next(inHeap.count)]
                let out = heap.remove(at: victim.index)
                #expect(out === victim, "step \(step): remove(at: \(victim.index)) took another element")
                inHeap.removeAll { $0 === victim }
                removed.append(victim)
            default:
                let modulus = 2 + random.next(5)
                heap.keepOnly { $0.id % modulus != 0 }
                removed += inHeap.filter { $0.id % modulus == 0 }
                inHeap.removeAll { $0.id % modulus == 0 }
            }
            #expect(heap.count == inHeap.count)
            if let least = inHeap.min(by: { $0.isBefore($1) }) {
                #expect(heap.first === least, "step \(step): first is not the least")
            } else {
                #expect(heap.first == nil)
            }
            // Each element's index: distinct, in range, and the heap's
            // element there is that element.
            let indices = Set(inHeap.map(\.index))
            #expect(indices.count == inHeap.count && indices.allSatisfy { (0..<inHeap.count).contains($0) })
            if step % 97 == 0 {
                for entry in inHeap {
                    // Removing and pushing back through the told index is
                    // the only way to look at a slot: it must be the entry.
                    #expect(heap.remove(at: entry.index) === entry)
                    heap.push(entry)
                }
            }
            for entry in removed.suffix(3) { #expect(entry.index == -1) }
        }
        heap.removeAll()
        #expect(heap.isEmpty)
        #expect(inHeap.allSatisfy { $0.index == -1 })
    }

    /// `keepOnly` keeps heap order whatever it drops: the kept elements pop
    /// in order afterwards.
    @Test func keepOnlyLeavesAHeapThatPopsInOrder() {
        var heap = MinHeap<Entry>()
        let entries = (0..<1_000).map { Entry(key: ($0 * 7919) % 1_000, id: $0) }
        for entry in entries { heap.push(entry) }
        heap.keepOnly { $0.key % 3 != 0 }
        #expect(entries.filter { $0.key % 3 == 0 }.allSatisfy { $0.index == -1 })
        var popped: [Int] = []
        while !heap.isEmpty { popped.append(heap.popFirst().key) }
        #expect(popped == entries.map(\.key).filter { $0 % 3 != 0 }.sorted())
    }
}
