"""Writes a TensorBoard log folder the way torch's SummaryWriter does.

torch.utils.tensorboard needs the tensorboard package, which this machine's
Debian does not ship, so this is an independent writer that follows the file
format's description: TFRecord framing with masked CRC32C (computed bit by
bit here, unlike the reader's table), and Event / Summary protobufs encoded
by hand from TensorBoard's field numbers. It imitates SummaryWriter's
choices: a file named events.out.tfevents.<time>.<host>.<pid>.<n> per writer,
a first record with file_version "brain.Event:2", one Event per add_scalar,
add_scalar's simple_value, its new_style tensor (float_val, with the
"scalars" plugin metadata on the first value of a tag) and its
double_precision tensor (double_val), and text summaries beside them.

usage: write_tfevents.py OUTDIR

OUTDIR gets two files: a first run, steps 0..99, then a restart from step 90
to 149 whose values for steps 90..99 replace the first run's. The loss is
NaN at step 120.
"""

import math
import os
import struct
import sys


def crc32c(data):
    crc = 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


def masked(crc):
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def varint(v):
    out = bytearray()
    v &= (1 << 64) - 1
    while v >= 0x80:
        out.append((v & 0x7F) | 0x80)
        v >>= 7
    out.append(v)
    return bytes(out)


def key(field, wire):
    return varint(field << 3 | wire)


def length_delimited(field, payload):
    return key(field, 2) + varint(len(payload)) + payload


def record(data):
    header = struct.pack("<Q", len(data))
    return (header + struct.pack("<I", masked(crc32c(header))) + data +
            struct.pack("<I", masked(crc32c(data))))


def event(wall_time, step=None, file_version=None, summary=None):
    out = key(1, 1) + struct.pack("<d", wall_time)
    if step:  # proto3 leaves a zero out
        out += key(2, 0) + varint(step)
    if file_version is not None:
        out += length_delimited(3, file_version.encode())
    if summary is not None:
        out += length_delimited(5, summary)
    return out


def plugin_metadata(name):
    plugin = length_delimited(1, name.encode())
    data_class = 1 if name == "scalars" else 2  # DATA_CLASS_SCALAR, _TENSOR
    return length_delimited(1, plugin) + key(4, 0) + varint(data_class)


def value(tag, simple=None, tensor=None, metadata=None):
    out = length_delimited(1, tag.encode())
    if metadata is not None:
        out += length_delimited(9, metadata)
    if simple is not None:
        out += key(2, 5) + struct.pack("<f", simple)
    if tensor is not None:
        out += length_delimited(8, tensor)
    return length_delimited(1, out)  # Summary.value


def float_tensor(v):
    # DT_FLOAT, rank 0 (an empty shape), float_val packed
    return (key(1, 0) + varint(1) + length_delimited(2, b"") +
            length_delimited(5, struct.pack("<f", v)))


def double_tensor(v):
    return (key(1, 0) + varint(2) + length_delimited(2, b"") +
            length_delimited(6, struct.pack("<d", v)))


def text_tensor(s):
    return (key(1, 0) + varint(7) + length_delimited(2, length_delimited(2, key(1, 0) + varint(1))) +
            length_delimited(8, s.encode()))


class Writer:
    def __init__(self, folder, wall_time, counter):
        name = "events.out.tfevents.%d.testhost.%d.%d" % (int(wall_time), os.getpid(), counter)
        self.f = open(os.path.join(folder, name), "wb")
        self.wall = wall_time
        self.tags = set()
        self.f.write(record(event(self.wall, file_version="brain.Event:2")))

    def add(self, tag, step, simple=None, tensor=None, plugin="scalars"):
        metadata = None
        if tensor is not None and tag not in self.tags:
            metadata = plugin_metadata(plugin)
        self.tags.add(tag)
        self.wall += 0.001
        self.f.write(record(event(self.wall, step, summary=value(tag, simple, tensor, metadata))))

    def close(self):
        self.f.close()


def loss(step, run):
    if step == 120:
        return float("nan")
    return 4.0 * math.exp(-step / 400.0) + (0.25 if run == 1 and step >= 90 else 0.0)


def main():
    folder = sys.argv[1]
    os.makedirs(folder, exist_ok=True)
    for run, (start, end, t0) in enumerate([(0, 100, 1700000000.0), (90, 150, 1700000500.0)]):
        w = Writer(folder, t0, run)
        for step in range(start, end):
            w.add("Loss/train", step, simple=loss(step, run))
            w.add("train/grad_norm", step, tensor=float_tensor(1.0 + 0.01 * (step % 7)))
            w.add("learning_rate", step, tensor=double_tensor(3e-4 * min(1.0, (step + 1) / 50.0)))
            w.add("val/accuracy", step, simple=0.5)
            if step % 50 == 0:
                w.add("notes", step, tensor=text_tensor("step %d" % step), plugin="text")
        w.close()


if __name__ == "__main__":
    main()
