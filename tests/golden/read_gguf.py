"""A stand-in for llama.cpp: reads a GGUF file as its loader does and computes logits as its graph.

  /usr/bin/python3 tests/golden/read_gguf.py FILE.gguf ID [ID ...]

prints the logits of every position of the sequence ID ... (one line each, space-separated), as
llama.cpp's `llama` and `qwen2` architectures compute them; `forge export --format gguf` writes
those files and tests/formats/test_gguf_export.cpp compares these logits with Forge's own. llama.cpp
cannot be installed here, so this script follows its sources (src/llama-model.cpp for the keys and
tensor shapes each architecture loads, ggml's rope for the rotation) rather than Forge's:
  - the header, metadata and tensor infos of GGUF v3, the data at general.alignment, f32 tensors;
  - every tensor the architecture loads, with the shape llama.cpp asks for, and no other (llama.cpp
    refuses a file with tensors it did not load: "wrong number of tensors");
  - llama: rope type NORM, which rotates ADJACENT pairs (2i, 2i+1) of each head (hence the
    permuted q/k rows a converter writes); qwen2: NEOX, pairs (i, i + n_rot/2);
  - theta_i = pos * freq_scale * freq_base^(-2i/n_rot) / rope_freqs[i], freq_scale = 1/factor for
    rope.scaling.type linear; grouped-query attention (query head h reads kv head h / (H / Hkv));
    RMSNorm, SwiGLU, 1/sqrt(head_dim) attention scale, causal mask; output = token_embd if absent.
Computed in float64. An unreadable or inconsistent file is one line on stderr and exit 1.
"""
import math
import struct
import sys

import torch

dt = torch.float64
# GGUF value types: struct format of each scalar type; 8 = string, 9 = array.
SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?",
           10: "<Q", 11: "<q", 12: "<d"}
GGML_F32 = 0


class Reader:
    def __init__(self, data):
        self.data, self.pos = data, 0

    def take(self, n):
        if n > len(self.data) - self.pos:
            raise ValueError(f"truncated at byte {self.pos}")
        out = self.data[self.pos:self.pos + n]
        self.pos += n
        return out

    def scalar(self, fmt):
        return struct.unpack(fmt, self.take(struct.calcsize(fmt)))[0]

    def string(self):
        return self.take(self.scalar("<Q")).decode("utf-8")

    def value(self, kind):
        if kind in SCALARS:
            return self.scalar(SCALARS[kind])
        if kind == 8:
            return self.string()
        if kind == 9:
            element, n = self.scalar("<I"), self.scalar("<Q")
            return [self.value(element) for _ in range(n)]
        raise ValueError(f"unknown value type {kind} at byte {self.pos}")


def read_gguf(path):
    """(metadata dict, {name: tensor with torch's dimension order})."""
    with open(path, "rb") as f:
        data = f.read()
    r = Reader(data)
    if r.take(4) != b"GGUF":
        raise ValueError("not a GGUF file (no magic)")
    version = r.scalar("<I")
    if version != 3:
        raise ValueError(f"GGUF version {version}, expected 3")
    n_tensors, n_kv = r.scalar("<Q"), r.scalar("<Q")
    meta = {}
    for _ in range(n_kv):
        key = r.string()
        if key in meta:
            raise ValueError(f"duplicate key {key}")
        meta[key] = r.value(r.scalar("<I"))
    infos = []
    for _ in range(n_tensors):
        name = r.string()
        dims = [r.scalar("<Q") for _ in range(r.scalar("<I"))]
        kind, offset = r.scalar("<I"), r.scalar("<Q")
        infos.append((name, dims, kind, offset))
    alignment = meta.get("general.alignment", 32)
    start = (r.pos + alignment - 1) // alignment * alignment
    tensors = {}
    for name, dims, kind, offset in infos:
        if kind != GGML_F32:
            raise ValueError(f"tensor {name}: ggml type {kind}; this reader takes f32 only")
        if offset % alignment:
            raise ValueError(f"tensor {name}: offset {offset} is not a multiple of {alignment}")
        n = math.prod(dims)
        if start + offset + 4 * n > len(data):
            raise ValueError(f"tensor {name} runs past the end of the file")
        if name in tensors:
            raise ValueError(f"duplicate tensor {name}")
        flat = torch.frombuffer(bytearray(data[start + offset:start + offset + 4 * n]),
                                dtype=torch.float32)
        # ggml lists dimensions innermost first; torch outermost first.
        tensors[name] = flat.reshape(list(reversed(dims))).to(dt)
    return meta, tensors


class Model:
    """What llama.cpp's loader takes from the file for the llama and qwen2 architectures."""

    def __init__(self, meta, tensors):
        arch = meta.get("general.architecture")
        if arch not in ("llama", "qwen2"):
            raise ValueError(f"general.architecture {arch!r}: this reader runs llama and qwen2")
        self.arch, self.tensors, self.used = arch, tensors, set()

        def key(name, default=None):
            value = meta.get(f"{arch}.{name}", default)
            if value is None:
                raise ValueError(f"missing key {arch}.{name}")
            return value

        self.n_embd = key("embedding_length")
        self.n_layer = key("block_count")
        self.n_ff = key("feed_forward_length")
        self.n_head = key("attention.head_count")
        self.n_head_kv = key("attention.head_count_kv", self.n_head)
        self.eps = key("attention.layer_norm_rms_epsilon")
        self.head_k = key("attention.key_length", self.n_embd // self.n_head)
        self.head_v = key("attention.value_length", self.n_embd // self.n_head)
        self.n_rot = key("rope.dimension_count", self.head_k)
        self.freq_base = key("rope.freq_base", 10000.0)
        key("context_length")  # llama.cpp refuses a file without it; the graph does not read it
        if arch == "llama" and self.n_rot != self.head_k:
            raise ValueError(f"invalid n_rot: {self.n_rot}, expected {self.head_k}")
        if self.n_head % self.n_head_kv:
            raise ValueError(f"head_count_kv {self.n_head_kv} does not divide {self.n_head}")
        scaling = key("rope.scaling.type", "none")
        if scaling == "linear":
            self.freq_scale = 1.0 / key("rope.scaling.factor")
        elif scaling == "none":
            self.freq_scale = 1.0
        else:
            raise ValueError(f"rope.scaling.type {scaling!r}: this reader runs none and linear")

        C, F = self.n_embd, self.n_ff
        q_width, kv_width = self.head_k * self.n_head, self.head_k * self.n_head_kv
        v_width = self.head_v * self.n_head_kv
        if arch == "qwen2":
            q_width = C  # llama.cpp's qwen2 loads attn_q as {n_embd, n_embd}
        n_vocab = len(meta.get("tokenizer.ggml.tokens", []))
        self.tok_embd = self.get("token_embd.weight", [n_vocab, C])
        self.output_norm = self.get("output_norm.weight", [C])
        self.output = self.get("output.weight", [n_vocab, C], required=False)
        if self.output is None:
            self.output = self.tok_embd
        self.output_b = (self.get("output.bias", [n_vocab], required=False)
                         if arch == "qwen2" else None)
        self.rope_freqs = (self.get("rope_freqs.weight", [self.n_rot // 2], required=False)
                           if arch == "llama" else None)
        self.layers = []
        for i in range(self.n_layer):
            def t(name, shape, required=True):
                return self.get(f"blk.{i}.{name}", shape, required)
            o_width = self.head_k * self.n_head if arch == "llama" else C
            self.layers.append(dict(
                attn_norm=t("attn_norm.weight", [C]),
                wq=t("attn_q.weight", [q_width, C]), wk=t("attn_k.weight", [kv_width, C]),
                wv=t("attn_v.weight", [v_width, C]),
                wo=t("attn_output.weight", [C, o_width]),
                # Both architectures add these biases when the file has them (llama.cpp loads
                # them with the shapes it gives them, {n_embd} and {n_embd_gqa}).
                bq=t("attn_q.bias", [C], False), bk=t("attn_k.bias", [kv_width], False),
                bv=t("attn_v.bias", [kv_width], False),
                bo=t("attn_output.bias", [C], False) if arch == "llama" else None,
                ffn_norm=t("ffn_norm.weight", [C]), gate=t("ffn_gate.weight", [F, C]),
                up=t("ffn_up.weight", [F, C]), down=t("ffn_down.weight", [C, F])))
        unused = sorted(set(tensors) - self.used)
        if unused:
            raise ValueError(f"wrong number of tensors: {len(tensors)} in the file, "
                             f"{len(self.used)} loaded; not loaded: {', '.join(unused)}")

    def get(self, name, shape, required=True):
        """The tensor `name`, checked against the torch-order shape llama.cpp creates it with."""
        if name not in self.tensors:
            if required:
                raise ValueError(f"missing tensor '{name}'")
            return None
        t = self.tensors[name]
        if list(t.shape) != shape:
            raise ValueError(f"tensor '{name}' has wrong shape; expected {list(reversed(shape))}, "
                             f"got {list(reversed(t.shape))} (ggml order)")
        self.used.add(name)
        return t

    def rope(self, x):
        """x [T, heads, D] rotated as ggml_rope_ext: NORM (llama) or NEOX (qwen2) pairs."""
        T, half = x.shape[0], self.n_rot // 2
        i = torch.arange(half, dtype=dt)
        freq = self.freq_scale * self.freq_base ** (-2.0 * i / self.n_rot)
        if self.rope_freqs is not None:
            freq = freq / self.rope_freqs
        angle = torch.arange(T, dtype=dt)[:, None] * freq[None, :]
        cos, sin = angle.cos()[:, None, :], angle.sin()[:, None, :]
        out = x.clone()
        if self.arch == "llama":
            x0, x1 = x[..., 0:self.n_rot:2], x[..., 1:self.n_rot:2]
            out[..., 0:self.n_rot:2] = x0 * cos - x1 * sin
            out[..., 1:self.n_rot:2] = x0 * sin + x1 * cos
        else:
            x0, x1 = x[..., :half], x[..., half:self.n_rot]
            out[..., :half] = x0 * cos - x1 * sin
            out[..., half:self.n_rot] = x0 * sin + x1 * cos
        return out

    def rms_norm(self, x, w):
        return x / torch.sqrt((x * x).mean(-1, keepdim=True) + self.eps) * w

    def logits(self, ids):
        T = len(ids)
        if any(i < 0 or i >= self.tok_embd.shape[0] for i in ids):
            raise ValueError(f"token ids must be in [0, {self.tok_embd.shape[0]})")
        x = self.tok_embd[torch.tensor(ids)]
        group = self.n_head // self.n_head_kv
        mask = torch.full((T, T), -math.inf, dtype=dt).triu(1)
        for L in self.layers:
            h = self.rms_norm(x, L["attn_norm"])

            def proj(w, b):
                y = h @ w.T
                return y if b is None else y + b
            q = self.rope(proj(L["wq"], L["bq"]).reshape(T, self.n_head, self.head_k))
            k = self.rope(proj(L["wk"], L["bk"]).reshape(T, self.n_head_kv, self.head_k))
            v = proj(L["wv"], L["bv"]).reshape(T, self.n_head_kv, self.head_v)
            k = k.repeat_interleave(group, dim=1)  # query head h reads kv head h // group
            v = v.repeat_interleave(group, dim=1)
            scores = torch.einsum("thd,shd->hts", q, k) / math.sqrt(self.head_k) + mask
            y = torch.einsum("hts,shd->thd", scores.softmax(-1), v).reshape(T, -1)
            y = y @ L["wo"].T
            x = x + (y if L["bo"] is None else y + L["bo"])
            h = self.rms_norm(x, L["ffn_norm"])
            x = x + (torch.nn.functional.silu(h @ L["gate"].T) * (h @ L["up"].T)) @ L["down"].T
        out = self.rms_norm(x, self.output_norm) @ self.output.T
        return out if self.output_b is None else out + self.output_b


def main(argv):
    if len(argv) < 3:
        sys.exit("usage: read_gguf.py FILE.gguf ID [ID ...]")
    try:
        model = Model(*read_gguf(argv[1]))
        logits = model.logits([int(a) for a in argv[2:]])
    except (ValueError, OSError, UnicodeDecodeError) as e:
        sys.exit(f"{argv[1]}: {e}")
    for row in logits:
        print(" ".join(f"{v:.9e}" for v in row.tolist()))


if __name__ == "__main__":
    main(sys.argv)
