/// An element of a `MinHeap`: `isBefore` is a strict order (deadlines, then
/// submission order, for the timer heaps). `placed(at:)` hears of every
/// move, for elements that must be found again to be removed (default:
/// nothing).
protocol HeapOrdered {
    func isBefore(_ other: Self) -> Bool
    /// The element now sits at `index` (or -1: it left the heap).
    func placed(at index: Int)
}

extension HeapOrdered {
    func placed(at index: Int) {}
}

/// A binary min-heap in an array: O(log n) push, pop of the first element
/// and removal at a known index. Spindle's timer structure uses it: the pool
/// poller's `TimerQueue`, which holds queue timer sources and
/// `async(after:)` alike. Not thread-safe; its owner guards it.
///
/// Written with index loops and `Array`'s own members only (subscripts,
/// `count`, `append`, `remove(at:)`), never a `Sequence` or `Collection`
/// algorithm or an iterator: a forked child runs `keepOnly` first thing
/// (`TimerQueue.childAfterFork`), and in a build without specialization
/// those make type metadata or look up a conformance at run time for each
/// element type, under Swift runtime locks that a parent thread may have
/// held at the fork. Forked children hung in `keepOnly` twice in TSan passes
/// (making `ByDue?` for its iterator, 2026-11-28; in `filter`, 2026-11-29),
/// each time with a parent thread inside the runtime's lock.
struct MinHeap<Element: HeapOrdered> {
    private var elements: [Element] = []

    var first: Element? { elements.count == 0 ? nil : elements[0] }
    var isEmpty: Bool { elements.count == 0 }
    var count: Int { elements.count }

    mutating func push(_ element: Element) {
        elements.append(element)
        siftUp(elements.count - 1)
    }

    /// Removes and returns the first element. The heap must not be empty.
    mutating func popFirst() -> Element {
        remove(at: 0)
    }

    /// Removes and returns the element at `index` (as last told by
    /// `placed(at:)`). `index` must be in the heap.
    mutating func remove(at index: Int) -> Element {
        let removed = elements[index]
        let last = elements.remove(at: elements.count - 1)
        removed.placed(at: -1)
        guard index < elements.count else { return removed }
        elements[index] = last
        last.placed(at: index)
        if index > 0 && last.isBefore(elements[(index - 1) / 2]) {
            siftUp(index)
        } else {
            siftDown(index)
        }
        return removed
    }

    /// Keeps only the elements for which `keep` is true, in heap order
    /// again: in place, allocating nothing (the kept ones move down over
    /// the dropped ones, then the heap is rebuilt bottom-up).
    mutating func keepOnly(_ keep: (Element) -> Bool) {
        var kept = 0
        var i = 0
        while i < elements.count {
            let element = elements[i]
            if keep(element) {
                if kept != i { elements[kept] = element }
                kept += 1
            } else {
                element.placed(at: -1)
            }
            i += 1
        }
        while elements.count > kept { _ = elements.remove(at: elements.count - 1) }
        i = 0
        while i < kept {
            elements[i].placed(at: i)
            i += 1
        }
        var parent = kept / 2 - 1
        while parent >= 0 {
            siftDown(parent)
            parent -= 1
        }
    }

    mutating func removeAll() {
        var i = 0
        while i < elements.count {
            elements[i].placed(at: -1)
            i += 1
        }
        elements = []
    }

    /// Exchanges two elements (not `swapAt`: a `MutableCollection` method).
    private mutating func exchange(_ i: Int, _ j: Int) {
        let element = elements[i]
        elements[i] = elements[j]
        elements[j] = element
    }

    private mutating func siftUp(_ start: Int) {
        var i = start
        while i > 0 {
            let parent = (i - 1) / 2
            guard elements[i].isBefore(elements[parent]) else { break }
            exchange(i, parent)
            elements[i].placed(at: i)
            i = parent
        }
        elements[i].placed(at: i)
    }

    private mutating func siftDown(_ start: Int) {
        var i = start
        while true {
            let left = 2 * i + 1, right = left + 1
            var smallest = i
            if left < elements.count && elements[left].isBefore(elements[smallest]) { smallest = left }
            if right < elements.count && elements[right].isBefore(elements[smallest]) { smallest = right }
            if smallest == i { break }
            exchange(i, smallest)
            elements[i].placed(at: i)
            i = smallest
        }
        elements[i].placed(at: i)
    }
}
