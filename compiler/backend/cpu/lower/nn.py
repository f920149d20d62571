"""Op handlers of the lowering for the dense neural-network ops: MatMul, Gemm, Conv,
ConvTranspose, pooling, LRN, and the integer / quantised matmul and convolution. Float32 convs
and GEMMs with constant weights get the packed GEMM (weights packed now), im2col and the
depthwise kernel, float32 2-D pooling the 2-D pool kernels; the rest the generic kernel of the
same family (``kernels/gemm.py``, ``conv.py``, ``pool.py``)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from vtakit.runtime.plan import Arg, Call, Step

from ....ir.dtypes import DType
from ....ir.ops import Node, Op
from ..kernels import conv as C
from ..kernels import elementwise as E
from ..kernels import gemm as G
from ..kernels import loops as L
from ..kernels import pool as P
from ..kernels.scalar import Unsupported
from .base import (
    MACRO_SIG,
    PARALLEL_MIN_ELEMENTS,
    PARALLEL_MIN_MACS,
    LowererBase,
    _at,
    _axis_strides,
    _strides,
)


class NnLowering(LowererBase):
    # -- linear algebra -------------------------------------------------------------------------
    def op_matmul(self, n: Node, name: str) -> None:
        a, b = n.src[:2]
        ep = getattr(_at(n), "epilogue", None)
        nres = 1 if ep is not None and ep.residual else 0
        bias = n.src[2] if len(n.src) - nres == 3 else None
        residual = n.src[-1] if nres else None
        if (n.dtype is DType.FLOAT32 and b.op is Op.CONST and b.rank == 2 and a.rank >= 2
                and a.dtype is DType.FLOAT32 and (bias is None or bias.op is Op.CONST)):
            m = math.prod(a.shape[:-1])
            return self.packed_gemm(n, a, m, b.value, None if bias is None else
                                    bias.value.astype(np.float32), ep, residual, name)
        self.generic_matmul(n, a, b, name)
        self.epilogue_step(n, ep, residual, name, bias)

    def generic_matmul(self, n: Node, a: Node, b: Node, name: str, **extra: Any) -> None:
        ash = a.shape if a.rank >= 2 else (1,) + a.shape
        bsh = b.shape if b.rank >= 2 else b.shape + (1,)
        batch = tuple(np.broadcast_shapes(ash[:-2], bsh[:-2]))
        m, k = ash[-2], ash[-1]
        nn = bsh[-1]
        sa, sb = _strides(ash), _strides(bsh)
        ast = [s * m * k if s else 0 for s in L.broadcast_strides(ash[:-2], batch)]
        bst = [s * k * nn if s else 0 for s in L.broadcast_strides(bsh[:-2], batch)]
        spec = G.MatmulSpec(a.dtype, b.dtype, n.dtype, batch, m, nn, k,
                            (*ast, sa[-2], sa[-1]), (*bst, sb[-2], sb[-1]), **extra)
        return self._matmul_call(n, spec, [a, b], name)

    def _matmul_call(self, n: Node, spec: G.MatmulSpec, src: Sequence[Node], name: str,
                     extra_ptrs: Sequence[Arg] = ()) -> None:
        k = G.matmul(spec)
        self.call_generic(k, [self.out(n)] + [self.ptr(s) for s in src] + list(extra_ptrs),
                          name, n.op.value, spec.m * spec.n * spec.k * max(1, math.prod(
                              spec.batch)) // 8)

    def op_gemm(self, n: Node, name: str) -> None:
        a, b = n.src[:2]
        at = _at(n)
        ep = getattr(at, "epilogue", None)
        nres = 1 if ep is not None and ep.residual else 0
        c = n.src[2] if len(n.src) - nres == 3 else None
        nn = n.shape[1]
        simple_c = c is None or (c.op is Op.CONST and c.size == nn and c.shape[-1] == nn)
        if (n.dtype is DType.FLOAT32 and b.op is Op.CONST and not at.trans_a and simple_c
                and a.dtype is DType.FLOAT32):
            w = b.value.T if at.trans_b else b.value
            w = (w * np.float32(at.alpha)).astype(np.float32)
            bias = None if c is None else (c.value.reshape(-1) * np.float32(at.beta)).astype(
                np.float32)
            return self.packed_gemm(n, a, a.shape[0], w, bias, ep,
                                    n.src[-1] if nres else None, name)
        m, kk = (a.shape[1], a.shape[0]) if at.trans_a else a.shape
        sa = (1, m) if at.trans_a else (kk, 1)
        sb = (1, b.shape[1]) if at.trans_b else (nn, 1)
        cspec = None
        src = [a, b]
        if c is not None:
            cspec = (c.dtype, L.broadcast_strides(c.shape, n.shape))
            src.append(c)
        spec = G.MatmulSpec(a.dtype, b.dtype, n.dtype, (), m, nn, kk, sa, sb, at.alpha,
                            at.beta, cspec)
        self._matmul_call(n, spec, src, name)
        self.epilogue_step(n, ep, n.src[-1] if nres else None, name)

    def packed_gemm(self, n: Node, a: Node, m: int, w: np.ndarray, bias: np.ndarray | None,
                    ep: Any, residual: Node | None, name: str) -> None:
        """out[M, N] = act(a[M, K] @ w[K, N] + bias (+ residual)) with the weights packed now;
        ReLU / clip run in the GEMM's epilogue, a residual or another activation after it."""
        fast = _fast_act(ep)
        post = residual is not None or fast is None
        act, lo, hi = _as_clip(("none", 0.0, 0.0) if post or fast is None else fast)
        kdim, nn = w.shape
        cfg = G.choose_config(nn, m)
        pb = G.pack_b(np.ascontiguousarray(w, np.float32), cfg)
        wb = self.const(pb.data, "packed_b")
        mode: G.BiasMode = "col" if bias is not None else "none"
        gact: G.Act = "clip"  # _as_clip: every activation is a clip with run-time bounds
        assert act == gact
        gk = self.kernel(("gemm", cfg, mode, gact), lambda: G.build_module(cfg, mode, gact))
        bias_arg: Arg = ("b", self.const(np.concatenate([bias, np.zeros(
            pb.panels * cfg.nr - nn, np.float32)]), "bias"), 0) if bias is not None else ("i", 0)
        mt = -(-m // cfg.mr)
        apack = self.buffer("arena", DType.FLOAT32, (mt, kdim, cfg.mr))
        dst = self.out(n)
        pack = Call(gk, "pack_a", "ppllll" + "l", (self.ptr(a), ("b", apack, 0), ("i", m),
                                                   ("i", kdim), ("i", kdim), ("lo",), ("hi",)))
        self.add_step(Step(name + ":pack", "pack_a", [pack], mt,
                               m * kdim >= PARALLEL_MIN_ELEMENTS and mt > 1))
        nt = pb.panels
        if mt >= nt * 2 or nt < self.threads:
            ranges: tuple[Arg, ...] = (("lo",), ("hi",), ("i", 0), ("i", nt))
            extent = mt
        else:
            ranges = (("i", 0), ("i", mt), ("lo",), ("hi",))
            extent = nt
        call = Call(gk, "gemm_packed", MACRO_SIG,
                    (("b", apack, 0), ("b", wb, 0), dst, bias_arg, ("i", m), ("i", nn),
                     ("i", kdim), ("i", nn), *ranges, ("f", lo), ("f", hi)))
        self.add_step(Step(name, "gemm", [call], extent,
                               m * nn * kdim >= PARALLEL_MIN_MACS and extent > 1))
        if post:
            self.epilogue_step(n, ep, residual, name)

    def op_conv(self, n: Node, name: str) -> None:
        x, w = n.src[:2]
        at = _at(n)
        ep = getattr(at, "epilogue", None)
        nres = 1 if ep is not None and ep.residual else 0
        has_bias = len(n.src) - nres == 3
        bias = n.src[2] if has_bias else None
        residual = n.src[-1] if ep is not None and ep.residual else None
        nsp = len(at.kernel)
        if (n.dtype is DType.FLOAT32 and nsp == 2 and w.op is Op.CONST
                and at.pads[:2] == at.pads[2:] and x.dtype is DType.FLOAT32
                and (bias is None or bias.op is Op.CONST)):
            return self.fast_conv(n, x, w.value, None if bias is None else bias.value, at,
                                  ep, residual, name)
        spec = C.ConvSpec(x.dtype, w.dtype, n.dtype, x.shape, w.shape, n.shape, at.strides,
                          at.pads, at.dilations, at.group,
                          bias.dtype if bias is not None else None)
        k = C.conv(spec)
        src = [x, w] + ([bias] if bias is not None else [])
        self.call_generic(k, [self.out(n)] + [self.ptr(s) for s in src], name, "conv",
                          n.size * math.prod(w.shape[1:]) // 8)
        self.epilogue_step(n, ep, residual, name)

    def op_conv_transpose(self, n: Node, name: str) -> None:
        x, w = n.src[:2]
        at = _at(n)
        bias = n.src[2] if len(n.src) == 3 else None
        spec = C.ConvSpec(x.dtype, w.dtype, n.dtype, x.shape, w.shape, n.shape, at.strides,
                          at.pads, at.dilations, at.group,
                          bias.dtype if bias is not None else None, transposed=True)
        src = [x, w] + ([bias] if bias is not None else [])
        self.call_generic(C.conv(spec), [self.out(n)] + [self.ptr(s) for s in src], name,
                          "conv_transpose", n.size * math.prod(w.shape[1:]))

    def fast_conv(self, n: Node, x: Node, w: np.ndarray, bias: np.ndarray | None,
                  at: Any, ep: Any, residual: Node | None, name: str) -> None:
        fast = _fast_act(ep)
        post = residual is not None or fast is None
        act, lo, hi = _as_clip(("none", 0.0, 0.0) if post or fast is None else fast)
        conv = C.Conv2d(np.ascontiguousarray(w, np.float32),
                        None if bias is None else np.ascontiguousarray(bias, np.float32),
                        at.strides, at.pads[:2], at.dilations, at.group,
                        None if act == "none" else act, (lo, hi) if act == "clip" else None)
        nb, cin, h, wd = x.shape
        g = conv.geom(h, wd)
        dst = self.out(n)
        _, dbuf, doff = dst
        xb, xoff = self.where(x)
        fused: tuple[E.Instr, ...] = ()  # epilogue fused into the copy-out of padded GEMMs
        if conv.depthwise:
            geom = C.ConvGeom(1, *C.dataclass_fields(g)[1:])
            dki = self.kernel(("depthwise", geom, act),
                              lambda: C.depthwise_module(geom, act))
            wb = self.const(conv.weight, "dw_weight")
            bb = self.const(conv.bias, "dw_bias")
            for i in range(nb):
                call = Call(dki, "depthwise", "ppppllff", (
                    ("b", xb, xoff + 4 * i * cin * h * wd), ("b", wb, 0), ("b", bb, 0),
                    ("b", dbuf, doff + 4 * i * conv.cout * g.oh * g.ow), ("lo",), ("hi",),
                    ("f", lo), ("f", hi)))
                work = conv.cout * g.oh * g.ow * g.kh * g.kw
                self.add_step(Step(name, "conv_dw", [call], conv.cout,
                                       work >= PARALLEL_MIN_MACS and self.threads > 1))
        else:
            npix = g.oh * g.ow
            cfg = conv.cfg or G.choose_config(npix)
            packed, pbias = conv._prepared(cfg)
            panels = -(-npix // cfg.nr)
            kdim = g.c * g.kh * g.kw
            ik = self.kernel(("im2col", g, cfg.nr), lambda: C._im2col_module(g, cfg.nr))
            gact: G.Act = "clip"
            assert act == gact
            gk = self.kernel(("gemm", cfg, "row", gact),
                             lambda: G.build_module(cfg, "row", gact))
            cg = conv.cout // conv.groups
            mpad, npad = packed[0].panels * cfg.mr, panels * cfg.nr
            padded = (mpad, npad) != (cg, npix)
            col = self.buffer("arena", DType.FLOAT32, (panels, kdim, cfg.nr))
            ybuf = self.buffer("arena", DType.FLOAT32, (mpad, npad)) if padded else None
            if padded and post and conv.groups == 1:
                fused = tuple(self.epilogue_program(ep, residual, n.dtype))
            pas = [self.const(pa.data, "packed_w") for pa in packed]
            bbs = [self.const(np.ascontiguousarray(pbias[i]), "bias") for i in
                   range(conv.groups)]
            big = cg * npix * kdim >= PARALLEL_MIN_MACS and self.threads > 1
            # Few pixel panels (the late, small feature maps): split the GEMM over its output
            # channels instead, after an im2col split over the panels.
            msplit = big and panels < 4 * self.threads and packed[0].panels > panels
            for i in range(nb):
                for grp in range(conv.groups):
                    xa = ("b", xb, xoff + 4 * (i * conv.cin + grp * g.c) * h * wd)
                    ya = doff + 4 * (i * conv.cout + grp * cg) * npix
                    im2col = Call(ik, "im2col_pack", "ppll", (xa, ("b", col, 0), ("lo",),
                                                              ("hi",)))
                    pa = packed[grp]
                    mr_ = (("lo",), ("hi",), ("i", 0), ("i", panels)) if msplit else \
                        (("i", 0), ("i", pa.panels), ("lo",), ("hi",))
                    if ybuf is None:
                        gemm = Call(gk, "gemm_packed", MACRO_SIG, (
                            ("b", pas[grp], 0), ("b", col, 0), ("b", dbuf, ya),
                            ("b", bbs[grp], 0), ("i", cg), ("i", npix), ("i", kdim),
                            ("i", npix), *mr_, ("f", lo), ("f", hi)))
                        copy = None
                    else:
                        gemm = Call(gk, "gemm_packed", MACRO_SIG, (
                            ("b", pas[grp], 0), ("b", col, 0), ("b", ybuf, 0),
                            ("b", bbs[grp], 0), ("i", mpad), ("i", npad), ("i", kdim),
                            ("i", npad), *mr_, ("f", lo), ("f", hi)))
                        # the epilogue the GEMM did not fuse runs in the copy-out
                        prog = fused if conv.groups == 1 else ()
                        pk = C.panel_copy(cg, npad, npix, cfg.nr, prog)
                        res = [self.ptr(residual)] if prog and residual is not None else []
                        if res:
                            r = res[0]
                            res = [("b", r[1], r[2] + 4 * i * conv.cout * npix)]
                        copy = Call(self.kernel(pk.key, pk.build), pk.fname, pk.sig, (
                            ("b", dbuf, ya), ("b", ybuf, 0), *res, ("lo",), ("hi",)))
                    if msplit:
                        self.add_step(Step(name + ":im2col", "im2col", [im2col], panels,
                                               kdim * npix >= PARALLEL_MIN_ELEMENTS
                                               and panels > 1))
                        self.add_step(Step(name, "conv", [gemm], pa.panels, True))
                        if copy is not None:
                            self.add_step(Step(name + ":copy", "copy", [copy], panels,
                                                   cg * npix >= PARALLEL_MIN_ELEMENTS
                                                   and panels > 1))
                    else:
                        calls = [im2col, gemm] + ([copy] if copy is not None else [])
                        self.add_step(Step(name, "conv", calls, panels,
                                               big and panels > 1))
        if post and not fused:
            self.epilogue_step(n, ep, residual, name)

    def op_max_pool(self, n: Node, name: str) -> None:
        x = n.src[0]
        a = _at(n)
        kind: P.PoolKind = "max" if n.op is Op.MAX_POOL else "avg"
        nsp = len(a.kernel)
        if (x.dtype is DType.FLOAT32 and nsp == 2 and a.pads[:2] == a.pads[2:]
                and a.dilations == (1, 1)):
            geom = P.PoolGeom(x.shape[2], x.shape[3], a.kernel[0], a.kernel[1], a.strides[0],
                              a.strides[1], a.pads[0], a.pads[1], a.count_include_pad)
            # (larger pads crash LLVM's optimiser on pool.py's module: generic path for them)
            if (geom.oh, geom.ow) == n.shape[2:] and 2 * a.pads[0] < a.kernel[0] \
                    and 2 * a.pads[1] < a.kernel[1]:
                kk = self.kernel(("pool", kind, geom), lambda: P._pool_module(kind, geom))
                planes = x.shape[0] * x.shape[1]
                call = Call(kk, "pool", "ppll", (self.ptr(x), self.out(n), ("lo",), ("hi",)))
                self.add_step(Step(name, n.op.value, [call], planes,
                                       n.size >= PARALLEL_MIN_ELEMENTS // 4 and planes > 1))
                return
        if (kind == "max" and x.dtype in (DType.INT8, DType.UINT8) and nsp == 2
                and a.pads[:2] == a.pads[2:] and a.dilations == (1, 1)
                and 2 * a.pads[0] < a.kernel[0] and 2 * a.pads[1] < a.kernel[1]):
            geom = P.PoolGeom(x.shape[2], x.shape[3], a.kernel[0], a.kernel[1], a.strides[0],
                              a.strides[1], a.pads[0], a.pads[1])
            if (geom.oh, geom.ow) == n.shape[2:]:
                unsigned = x.dtype is DType.UINT8
                kk = self.kernel(("max_pool_8bit", geom, unsigned),
                                 lambda: P.max_pool_8bit_module(geom, unsigned))
                planes = x.shape[0] * x.shape[1]
                call = Call(kk, "pool", "ppll", (self.ptr(x), self.out(n), ("lo",), ("hi",)))
                self.add_step(Step(name, n.op.value, [call], planes,
                                   n.size >= PARALLEL_MIN_ELEMENTS and planes > 1))
                return
        spec = P.PoolSpec(kind, x.dtype, x.shape, n.shape, a.kernel, a.strides, a.pads,
                          a.dilations, a.count_include_pad)
        self.call_generic(P.pool(spec), [self.out(n), self.ptr(x)], name, n.op.value,
                          n.size * math.prod(a.kernel))

    op_avg_pool = op_max_pool

    def op_lp_pool(self, n: Node, name: str) -> None:
        x = n.src[0]
        a = _at(n)
        pa = a.pool
        if not x.dtype.is_float:
            raise Unsupported(f"lp_pool of {x.dtype.value}")
        spec = P.PoolSpec("lp", x.dtype, x.shape, n.shape, pa.kernel, pa.strides, pa.pads,
                          pa.dilations, False, False, a.p)
        self.call_generic(P.pool(spec), [self.out(n), self.ptr(x)], name, "lp_pool",
                          n.size * math.prod(pa.kernel))

    def op_lrn(self, n: Node, name: str) -> None:
        x = n.src[0]
        a = _at(n)
        k = L.lrn(n.dtype, x.shape[0], x.shape[1], math.prod(x.shape[2:]), a.size, a.alpha,
                  a.beta, a.bias)
        self.call_generic(k, [self.out(n), self.ptr(x)], name, "lrn", n.size * a.size)

    def op_max_pool_index(self, n: Node, name: str) -> None:
        x = n.src[0]
        a = _at(n)
        spec = P.PoolSpec("index", x.dtype, x.shape, n.shape, a.kernel, a.strides, a.pads,
                          a.dilations, False, a.column_major)
        self.call_generic(P.pool(spec), [self.out(n), self.ptr(x)], name, "max_pool_index",
                          n.size * math.prod(a.kernel))

    # -- integer and quantised ------------------------------------------------------------------
    def op_requantize(self, n: Node, name: str) -> None:
        """REQUANTIZE as one elementwise program in int32 (wrapping, like the interpreter):
        add the bias, saturate to the clamp, multiply, add the rounding term, shift, clamp,
        narrow. Per-channel clamps, multipliers, rounding terms and shifts are constant
        operands along the axis. The integer elementwise ops that only it reads join its
        program (`int_chain`)."""
        if n.src[0].op in (Op.CONV_INTEGER, Op.MATMUL_INTEGER) and \
                self.fused_int8(n.src[0]) is n:
            return self.int8_gemm(n, name)
        self.int_chain_step(n, name)

    # -- integer elementwise chains: CAST / ADD / SUB / REQUANTIZE as one program ---------------
    _CHAIN = (Op.CAST, Op.ADD, Op.SUB, Op.REQUANTIZE)

    def _chain_op(self, n: Node) -> bool:
        """`n` can be an instruction of an integer chain's program: a widening CAST to int32
        of an integer, an int32 ADD / SUB, or a REQUANTIZE that no int8 kernel computes."""
        if n.op is Op.REQUANTIZE:
            acc = n.src[0]
            return not (acc.op in (Op.CONV_INTEGER, Op.MATMUL_INTEGER)
                        and self.fused_int8(acc) is n)
        if n.op is Op.CAST:
            return n.dtype is DType.INT32 and n.src[0].dtype in (
                DType.INT8, DType.UINT8, DType.INT16, DType.INT32)
        return n.op in (Op.ADD, Op.SUB) and n.dtype is DType.INT32

    def int_chain(self, n: Node) -> bool:
        """Whether `n` is computed inside the program of the integer chain that reads it (and
        so has no step or buffer of its own): a chain op (`_chain_op`) of the same shape as its
        one user, itself a chain op lowered here, not a graph output. The residual add of an
        imported QDQ model, ``REQUANTIZE(ADD(REQUANTIZE(CAST(a)), REQUANTIZE(CAST(b))))``, is
        one step instead of six, with no int32 tensor in memory."""
        if id(n) in self._chained:
            return self._chained[id(n)]
        users = self._users.get(n, [])
        u = users[0] if len(users) == 1 else None
        ours = ("cpu", None)  # not lowered by another backend (they lower before this one)
        ok = (u is not None and self._chain_op(n) and self._chain_op(u) and u.shape == n.shape
              and self.plan.taken.get(id(u)) in ours and self.plan.taken.get(id(n)) in ours
              and not any(o is n for o in self.plan.g.outputs))
        self._chained[id(n)] = ok
        return ok

    def int_chain_step(self, n: Node, name: str) -> None:
        """`n` (a chain op) and the chain ops it absorbs (`int_chain`) as one elementwise
        step; their other operands are its inputs."""
        prog = _Program()
        leaves: dict[int, int] = {}

        def value(v: Node, root: bool = False) -> int:
            if not root and not self.int_chain(v):
                if id(v) not in leaves:
                    leaves[id(v)] = prog.operand(v.dtype, L.broadcast_strides(v.shape, n.shape),
                                                 self.ptr(v))
                return leaves[id(v)]
            if v.op is Op.CAST:
                return prog.emit("cast", (value(v.src[0]),), (), v.dtype)
            if v.op in (Op.ADD, Op.SUB):
                return prog.emit(v.op.value, (value(v.src[0]), value(v.src[1])), (), v.dtype)
            return self._requant_program(prog, v, value(v.src[0]), name)

        value(n, root=True)
        operands, args, instrs = prog.finish()
        k = E.eltwise(n.dtype, n.shape, operands, instrs)
        self.call_generic(k, [self.out(n), *args], name, n.op.value, n.size)

    def _requant_program(self, prog: _Program, n: Node, x: int, name: str) -> int:
        """REQUANTIZE `n` of the int32 value `x` as instructions of `prog`; the result."""
        a = _at(n)
        i32 = DType.INT32
        ax = _axis_strides((n.shape[a.axis],), a.axis, n.rank)

        def operand(values: Sequence[int] | np.ndarray | Node) -> int:
            if isinstance(values, Node):
                arg = self.ptr(values)
                size = values.size
            else:
                arr = np.asarray(values, np.int32)
                arg, size = ("b", self.const(arr, f"{name}_requant"), 0), arr.size
            return prog.operand(i32, ax if size > 1 else (0,) * n.rank, arg)

        def emit(op: str, srcs: tuple[int, ...], params: tuple = ()) -> int:
            return prog.emit(op, srcs, params, i32)

        bias = operand(n.src[1]) if len(n.src) == 2 else None
        pre = None
        if any(a.pre_shift):  # (x + low bits + 2**(p-1)) >> p + high bits (ops.RequantAttrs)
            ps = np.asarray(a.pre_shift, np.int64)
            pre = (operand(ps), operand((1 << ps) - 1),
                   operand(np.where(ps > 0, 1 << np.maximum(ps - 1, 0), 0)))
        lo_hi = G.clamp_bounds(np.asarray(a.clamp)) if any(a.clamp) else None
        sat = tuple(operand(v) for v in lo_hi) if lo_hi else None
        mult = operand(a.multiplier)
        rounding = [(1 << (s - 1)) if s > 0 else 0 for s in a.shift]
        rnd = operand(rounding) if any(rounding) else None
        shift = operand(a.shift) if any(a.shift) else None

        v = x
        if pre is not None:
            p_op, mask, half = pre
            low = half if bias is None else emit("add", (emit("bitwise_and", (bias, mask)), half))
            v = emit("shr", (emit("add", (v, low)), p_op))
            if bias is not None:
                v = emit("add", (v, emit("shr", (bias, p_op))))
        elif bias is not None:
            v = emit("add", (v, bias))
        if sat is not None:
            v = emit("min", (emit("max", (v, sat[0])), sat[1]))
        v = emit("mul", (v, mult))
        if rnd is not None:
            v = emit("add", (v, rnd))
        if shift is not None:
            v = emit("shr", (v, shift))
        if a.zero_point:
            v = emit("add", (v,), (a.zero_point,))
        v = emit("max", (v,), (a.lo,))
        v = emit("min", (v,), (a.hi,))
        if n.dtype is not i32:
            v = prog.emit("cast", (v,), (), n.dtype)
        return v

    def op_matmul_integer(self, n: Node, name: str) -> None:
        if self.fused_int8(n) is not None:
            return  # lowered with the REQUANTIZE that reads it (int8 GEMM, fused epilogue)
        a, b, az, bz = n.src
        self._int_matmul(n, a, b, az, bz, None, name)

    def op_qlinear_matmul(self, n: Node, name: str) -> None:
        x, xs, xz, w, ws, wz, ys, yz = n.src
        self._int_matmul(n, x, w, xz, wz, (xs, ws, ys, yz), name)

    def _int_matmul(self, n: Node, a: Node, b: Node, az: Node, bz: Node,
                    q: tuple[Node, ...] | None, name: str) -> None:
        extra: dict[str, Any] = dict(zero_points=True, azp_str=1 if az.size > 1 else 0,
                                     bzp_str=1 if bz.size > 1 else 0, zp_dt=(az.dtype, bz.dtype))
        if q is not None:
            extra.update(requant=True, xs_str=1 if q[0].size > 1 else 0,
                         ws_str=1 if q[1].size > 1 else 0, scale_dt=q[0].dtype)
        ar, br = a.rank, b.rank
        if ar < 2 or br < 2:
            raise Unsupported("integer matmul of vectors")
        batch = tuple(np.broadcast_shapes(a.shape[:-2], b.shape[:-2]))
        m, k = a.shape[-2:]
        nn = b.shape[-1]
        sa, sb = _strides(a.shape), _strides(b.shape)
        ast = [s * m * k if s else 0 for s in L.broadcast_strides(a.shape[:-2], batch)]
        bst = [s * k * nn if s else 0 for s in L.broadcast_strides(b.shape[:-2], batch)]
        spec = G.MatmulSpec(a.dtype, b.dtype, n.dtype, batch, m, nn, k,
                            (*ast, sa[-2], sa[-1]), (*bst, sb[-2], sb[-1]), **extra)
        ptrs = [self.ptr(az), self.ptr(bz)] + ([self.ptr(v) for v in q] if q else [])
        self._matmul_call(n, spec, [a, b], name, ptrs)

    def op_conv_integer(self, n: Node, name: str) -> None:
        if self.fused_int8(n) is not None:
            return  # lowered with the REQUANTIZE that reads it (int8 GEMM, fused epilogue)
        x, w, xz, wz = n.src
        self._int_conv(n, x, w, xz, wz, None, None, name)

    # -- the fast int8 path: CONV_INTEGER / MATMUL_INTEGER + REQUANTIZE as one int8 kernel ------
    def fused_int8(self, acc: Node) -> Node | None:
        """The REQUANTIZE that `acc` (a CONV_INTEGER or MATMUL_INTEGER) fuses into, when the
        pair runs as the int8 GEMM with the requantisation in its epilogue, or as the int8
        depthwise kernel: int8 or uint8 activations with a constant zero point per tensor,
        constant weights whose zero points fold into them (`_int8_weights`), `acc` read by
        that REQUANTIZE alone (and not a graph output), a 2-D convolution with symmetric
        padding of one group or depthwise (group = input = output channels) or a matrix
        product with [K, N] weights, the REQUANTIZE along the channels without a pre-shift,
        to int8, uint8 or int32 (any zero point)."""
        if id(acc) in self._fused:
            return self._fused[id(acc)]
        self._fused[id(acc)] = None
        users = self._users.get(acc, [])
        if len(users) != 1 or any(o is acc for o in self.plan.g.outputs):
            return None
        rq = users[0]
        a = _at(rq) if rq.op is Op.REQUANTIZE else None
        x, w, xz, wz = acc.src
        if (a is None or rq.src[0] is not acc or any(a.pre_shift)
                or x.dtype not in (DType.INT8, DType.UINT8) or xz.op is not Op.CONST
                or xz.size != 1 or (len(rq.src) == 2 and rq.src[1].op is not Op.CONST)
                or rq.dtype not in (DType.INT8, DType.UINT8, DType.INT32)
                or not np.iinfo(rq.dtype.np).min <= a.lo <= a.hi <= np.iinfo(rq.dtype.np).max
                or self._int8_weights(acc) is None):
            return None
        if acc.op is Op.CONV_INTEGER:
            at = _at(acc)
            if (x.rank != 4 or not (at.group == 1 or self._int8_depthwise(acc))
                    or a.axis != 1 or at.pads[:2] != at.pads[2:]):
                return None
            g = self._int8_geom(acc)
            if (g.oh, g.ow) != acc.shape[2:]:
                return None
        elif w.rank != 2 or a.axis != acc.rank - 1 or x.rank < 2:
            return None
        self._fused[id(acc)] = rq
        return rq

    @staticmethod
    def _int8_weights(acc: Node) -> np.ndarray | None:
        """`acc`'s constant weights less their zero points (per tensor, or per output channel:
        a convolution's axis 0, a matrix product's columns) as int8, the same products as the
        graph's ``w - z_w``; None where the weights are not constant, the zero points not
        constant or of another shape, or a difference falls outside int8 (the general kernel
        then runs)."""
        w, wz = acc.src[1], acc.src[3]
        if w.op is not Op.CONST or wz.op is not Op.CONST or w.dtype not in (DType.INT8,
                                                                             DType.UINT8):
            return None
        ch = w.shape[0] if acc.op is Op.CONV_INTEGER else w.shape[-1]
        if wz.size != 1 and wz.shape != (ch,):
            return None
        z = wz.value.astype(np.int16).reshape(-1)
        if acc.op is Op.CONV_INTEGER:
            z = z.reshape(-1, *([1] * (w.rank - 1)))
        d = w.value.astype(np.int16) - z
        if d.size and (d.min() < -128 or d.max() > 127):
            return None
        return np.ascontiguousarray(d.astype(np.int8))

    @staticmethod
    def _int8_depthwise(acc: Node) -> bool:
        """`acc` (a CONV_INTEGER) filters every channel on its own: group = input channels =
        output channels, weights [C, 1, KH, KW]."""
        w, group = acc.src[1], _at(acc).group
        return w.rank == 4 and group > 1 and group == acc.src[0].shape[1] == w.shape[0] \
            and w.shape[1] == 1

    @staticmethod
    def _int8_geom(acc: Node) -> C.ConvGeom:
        at = _at(acc)
        _, cin, h, wd = acc.src[0].shape
        kh, kw = at.kernel
        return C.ConvGeom(cin, h, wd, kh, kw, at.strides[0], at.strides[1], at.pads[0],
                          at.pads[1], at.dilations[0], at.dilations[1])

    def int8_gemm(self, rq: Node, name: str) -> None:
        """`rq` = REQUANTIZE(CONV_INTEGER | MATMUL_INTEGER) as packs and one int8 GEMM whose
        epilogue adds the bias, saturates, multiplies, shifts, adds the zero point and clamps
        (kernels/gemm.py, gemm_s8). The input's zero point leaves through the bias (``- z_u *
        sum w`` per channel, `gemm.s8_channel_params`) and the padding, which holds it; the
        weights' zero points are folded into them (`_int8_weights`). A convolution runs with
        its channels as the GEMM's rows, or with its pixels as rows and a transposed store
        where that pads less (`gemm.choose_s8_conv_config`)."""
        acc = rq.src[0]
        if acc.op is Op.CONV_INTEGER and self._int8_depthwise(acc):
            return self.int8_depthwise(rq, name)
        a = _at(rq)
        x = acc.src[0]
        w = self._int8_weights(acc)
        assert w is not None  # fused_int8 checked
        # x - z_x: the packed activations are unsigned bytes u = x ^ xor; the zero point's byte
        # z_u times the weight sums leaves through the bias, and the padding holds z_x
        zx = int(acc.src[2].value.reshape(-1)[0])
        xor, z_u = G.activation_xor(x.dtype), G.activation_zero(x.dtype, zx)
        conv = acc.op is Op.CONV_INTEGER
        pointwise = direct = False
        if conv:
            cout = w.shape[0]
            g = self._int8_geom(acc)
            rows, kdim = g.oh * g.ow, g.c * g.kh * g.kw  # pixels per image, K
            images = x.shape[0]
            cfg = G.choose_s8_conv_config(cout, rows, kdim)
            # a 1x1 convolution of stride 1 without padding packs its input as the [K, pixels]
            # matrix; one of channels in fours straight from the image (im2col and packing
            # in one pass, k tap-major; rows of up to UNROLL_CHUNKS chunks); the others pack an
            # im2col matrix
            pointwise = (g.kh, g.kw, g.sh, g.sw, g.ph, g.pw) == (1, 1, 1, 1, 0, 0)
            direct = not pointwise and g.c % 4 == 0 and g.ow <= 64 * C.UNROLL_CHUNKS
            wk = C.tap_major(w) if direct else np.ascontiguousarray(w.reshape(cout, kdim))
            packed = G.pack_s8_weights(wk, cfg, "nk")
        else:
            kdim, cout = w.shape
            rows, images = math.prod(x.shape[:-1]), 1
            cfg = G.choose_s8_config(cout, rows, "b")
            packed = G.pack_s8_weights(w, cfg, "kn")
        ch = lambda v: np.broadcast_to(np.asarray(v, np.int64), (cout,))  # noqa: E731
        bias = rq.src[1].value.astype(np.int64) if len(rq.src) == 2 else None
        params = G.s8_channel_params(packed, bias, ch(a.multiplier), ch(a.shift), ch(a.clamp),
                                     z_u)
        pb, mb, sb, clo, chi = (self.const(p, f"{name}_{k}") for p, k in zip(
            params, ("bias", "m", "s", "clamp_lo", "clamp_hi"), strict=True))
        wb = self.const(packed.data, f"{name}_w8")
        out_bits = 32 if rq.dtype is DType.INT32 else 8
        vnni = G.default_vnni() if self.vnni is None else self.vnni
        clamped = params.clamped
        gk = self.kernel(("gemm_s8", cfg, "requant", out_bits, vnni, clamped),
                         lambda: G.build_s8_module(cfg, "requant", out_bits, vnni, clamped))
        # the activations are A (rows: a matrix product's, or a convolution's pixels, stored
        # transposed, NCHW) or B (a convolution's pixels as columns, channels as rows)
        act_a = cfg.weights == "b"
        width = cfg.mr if act_a else cfg.nr  # rows per activation panel
        apanels = -(-rows // width)
        k4 = -(-kdim // G.S8_KG)
        act = self.buffer("arena", DType.INT8, (apanels, k4, width, G.S8_KG))
        xb, xoff = self.where(x)
        dst = self.out(rq)
        _, dbuf, doff = dst
        obytes = out_bits // 8
        m_, n_ = (rows, cout) if act_a else (cout, rows)
        ldc = rows if cfg.store_t else n_
        mt, nt = -(-m_ // cfg.mr), -(-n_ // cfg.nr)
        pack = "pack_a_s8" if act_a else "pack_b_s8"
        macs = cout * rows * kdim
        big = macs >= 4 * PARALLEL_MIN_MACS and self.threads > 1
        for i in range(images):
            src: Arg
            if conv and direct:
                ik = self.kernel(("im2col_pack_8bit", g, width),
                                 lambda: C.im2col_pack_8bit_module(g, width))
                self.add_step(Step(name + ":im2col", "im2col", [Call(
                    ik, "im2col_pack_8bit", "ppll" + "ll", (
                        ("b", xb, xoff + i * g.c * g.h * g.w), ("b", act, 0), ("lo",), ("hi",),
                        ("i", zx), ("i", xor)))], apanels,
                    kdim * rows >= PARALLEL_MIN_ELEMENTS and apanels > 1))
            elif conv and pointwise:
                src, s_row, s_k = ("b", xb, xoff + i * g.c * g.h * g.w), 1, rows
            elif conv:
                col = self.buffer("arena", DType.INT8, (kdim, rows))
                ik = self.kernel(("im2col_8bit", g), lambda: C.im2col_8bit_module(g))
                self.add_step(Step(name + ":im2col", "im2col", [Call(
                    ik, "im2col_8bit", "ppll" + "l", (
                        ("b", xb, xoff + i * g.c * g.h * g.w), ("b", col, 0), ("lo",), ("hi",),
                        ("i", zx)))], g.oh, kdim * rows >= PARALLEL_MIN_ELEMENTS and g.oh > 1))
                src, s_row, s_k = ("b", col, 0), 1, rows
            else:
                src, s_row, s_k = ("b", xb, xoff), kdim, 1
            if not (conv and direct):
                self.add_step(Step(name + ":pack", "pack_s8", [Call(gk, pack, G.S8_PACK_SIG, (
                    src, ("b", act, 0), ("i", rows), ("i", kdim), ("i", s_row), ("i", s_k),
                    ("lo",), ("hi",), ("i", xor)))], apanels,
                    rows * kdim >= PARALLEL_MIN_ELEMENTS and apanels > 1))
            ap, bp = (("b", act, 0), ("b", wb, 0)) if act_a else (("b", wb, 0), ("b", act, 0))
            split_m = mt >= 2 * nt or nt < 2 * self.threads
            tiles = (("lo",), ("hi",), ("i", 0), ("i", nt)) if split_m else \
                (("i", 0), ("i", mt), ("lo",), ("hi",))
            self.add_step(Step(name, "gemm_s8", [Call(gk, "gemm_s8", G.S8_MACRO_SIG, (
                ap, bp, ("b", dbuf, doff + i * cout * rows * obytes), ("b", pb, 0),
                ("b", mb, 0), ("b", sb, 0), ("b", clo, 0), ("b", chi, 0), ("i", m_),
                ("i", n_), ("i", kdim), ("i", ldc),
                *tiles, ("i", a.lo), ("i", a.hi), ("i", a.zero_point)))],
                mt if split_m else nt,
                big and (mt if split_m else nt) > 1))

    def int8_depthwise(self, rq: Node, name: str) -> None:
        """`rq` = REQUANTIZE(depthwise CONV_INTEGER) as the int8 window kernel with the
        requantisation fused (kernels/conv.py, depthwise_s8): a step per image, its channels
        split over the threads. The kernel subtracts the input's zero point from every tap
        (the padding reads as that zero point) where it is not 0."""
        acc = rq.src[0]
        a = _at(rq)
        x = acc.src[0]
        w = self._int8_weights(acc)
        assert w is not None  # fused_int8 checked
        zx = int(acc.src[2].value.reshape(-1)[0])
        nb, cin, h, wd = x.shape
        g = self._int8_geom(acc)
        geom = C.ConvGeom(1, *C.dataclass_fields(g)[1:])
        out_bits = 32 if rq.dtype is DType.INT32 else 8
        clamped, unsigned, offset = any(a.clamp), x.dtype is DType.UINT8, zx != 0
        dk = self.kernel(("depthwise_s8", geom, out_bits, clamped, unsigned, offset),
                         lambda: C.depthwise_s8_module(geom, out_bits, clamped, unsigned,
                                                       offset))
        def per_channel(v: Any, what: str) -> int:  # int32 [C] (one value: every channel)
            return self.const(np.broadcast_to(np.asarray(v, np.int64), (cin,)).astype(np.int32),
                              f"{name}_{what}")

        pb = per_channel(rq.src[1].value if len(rq.src) == 2 else 0, "bias")
        mb, sb = per_channel(a.multiplier, "m"), per_channel(a.shift, "s")
        clo, chi = (per_channel(v, f"clamp_{k}") for v, k in zip(
            G.clamp_bounds(np.asarray(a.clamp)), ("lo", "hi"), strict=True))
        wb = self.const(np.ascontiguousarray(w.reshape(cin, g.kh * g.kw)), f"{name}_w8")
        xb, xoff = self.where(x)
        _, dbuf, doff = self.out(rq)
        obytes, npix = out_bits // 8, g.oh * g.ow
        work = cin * npix * g.kh * g.kw
        for i in range(nb):
            call = Call(dk, "depthwise_s8", "pppppppp" + "llllll", (
                ("b", xb, xoff + i * cin * h * wd), ("b", wb, 0), ("b", pb, 0), ("b", mb, 0),
                ("b", sb, 0), ("b", clo, 0), ("b", chi, 0),
                ("b", dbuf, doff + i * cin * npix * obytes), ("lo",), ("hi",), ("i", a.lo),
                ("i", a.hi), ("i", zx), ("i", a.zero_point)))
            self.add_step(Step(name, "depthwise_s8", [call], cin,
                               work >= PARALLEL_MIN_MACS and self.threads > 1))

    def op_qlinear_conv(self, n: Node, name: str) -> None:
        x, xs, xz, w, ws, wz, ys, yz = n.src[:8]
        bias = n.src[8] if len(n.src) == 9 else None
        self._int_conv(n, x, w, xz, wz, (xs, ws, ys, yz), bias, name)

    def _int_conv(self, n: Node, x: Node, w: Node, xz: Node, wz: Node,
                  q: tuple[Node, ...] | None, bias: Node | None, name: str) -> None:
        at = _at(n)
        spec = C.ConvSpec(x.dtype, w.dtype, n.dtype, x.shape, w.shape, n.shape, at.strides,
                          at.pads, at.dilations, at.group,
                          bias.dtype if bias is not None else None,
                          (xz.dtype, wz.dtype, 1 if wz.size > 1 else 0),
                          (0, 1 if q[1].size > 1 else 0) if q else None)
        src = [x, w] + ([bias] if bias is not None else []) + [xz, wz] + (list(q) if q else [])
        self.call_generic(C.conv(spec), [self.out(n)] + [self.ptr(s) for s in src], name,
                          n.op.value, n.size * math.prod(w.shape[1:]) // 8)


def _fast_act(ep: Any) -> tuple[str, float, float] | None:
    """The packed kernels' epilogue for an Epilogue: ("none" | "relu" | "clip", lo, hi), or
    None when its activation needs the generic path."""
    if ep is None or ep.activation is None:
        return ("none", 0.0, 0.0)
    if ep.activation == "relu":
        return ("relu", 0.0, 0.0)
    if ep.activation == "clip":
        lo = -math.inf if ep.clip_min is None else float(ep.clip_min)
        hi = math.inf if ep.clip_max is None else float(ep.clip_max)
        return ("clip", lo, hi)
    return None


def _as_clip(act: tuple[str, float, float]) -> tuple[str, float, float]:
    """none / relu as a clip with run-time bounds: one compiled GEMM per blocking and bias
    mode serves every activation (each GEMM module takes ~0.7 s to optimise)."""
    kind, lo, hi = act
    if kind == "none":
        return ("clip", -math.inf, math.inf)
    if kind == "relu":
        return ("clip", 0.0, math.inf)
    return act


class _Program:
    """An elementwise program being built (`kernels/elementwise.eltwise`): operands (dtype,
    strides, argument) and instructions added in any order, referred to by handles until
    `finish` numbers them as `eltwise` does (the operands first, then the instructions)."""

    def __init__(self) -> None:
        self.operands: list[tuple[DType, tuple[int, ...]]] = []
        self.args: list[Arg] = []
        self.instrs: list[tuple[str, tuple[int, ...], tuple, DType]] = []

    # handles: operand k is 2k, instruction j is 2j + 1
    def operand(self, dt: DType, strides: tuple[int, ...], arg: Arg) -> int:
        self.operands.append((dt, tuple(strides)))
        self.args.append(arg)
        return 2 * (len(self.operands) - 1)

    def emit(self, op: str, srcs: tuple[int, ...], params: tuple, dt: DType) -> int:
        self.instrs.append((op, srcs, params, dt))
        return 2 * (len(self.instrs) - 1) + 1

    def finish(self) -> tuple[list[tuple[DType, tuple[int, ...]]], list[Arg], list[E.Instr]]:
        nops = len(self.operands)

        def index(h: int) -> int:
            return h // 2 if h % 2 == 0 else nops + h // 2

        prog: list[E.Instr] = [(op, tuple(index(h) for h in srcs), params, dt)
                               for op, srcs, params, dt in self.instrs]
        return self.operands, self.args, prog
