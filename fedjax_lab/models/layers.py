"""Layers shared by the model zoo: convolution with a selectable lowering, pooling, normalisation, LRN.

The lowering of a convolution and of max-pooling changes speed only, never the function computed (tests
compare them); which is fastest depends on the backend (see docs/benchmarks.md).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Literal

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

Norm = Literal["batch", "group", "none"]
ConvLowering = Literal["xla", "im2col", "banded"]
Padding = tuple[tuple[int, int], tuple[int, int]]
"""Zeros before and after the rows, then the columns: ``((top, bottom), (left, right))``."""


def max_pool_2x2(x: jax.Array, padding: str = "VALID") -> jax.Array:
    """2x2 max-pooling with stride 2 over ``[B, H, W, C]``.

    Even sizes pool as the maximum of four strided slices (:func:`pool_corners`), whose gradient is
    elementwise; XLA's ``reduce_window`` gradient (``select_and_scatter``) is far slower on CPU. Odd sizes
    fall back to ``nn.max_pool`` (SAME pads on the bottom/right, VALID drops the last row/column).
    """
    _, h, w, _ = x.shape
    if h % 2 or w % 2:
        return nn.max_pool(x, (2, 2), strides=(2, 2), padding=padding)
    return pool_corners(x)


def _corners(x: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
    return x[:, 0::2, 0::2], x[:, 1::2, 0::2], x[:, 0::2, 1::2], x[:, 1::2, 1::2]


def _max_share(x: jax.Array, ans: jax.Array, other: jax.Array) -> jax.Array:
    """The share of ``max(x, other) = ans``'s gradient that ``x`` takes, as JAX's ``max`` rule gives it:
    ``[x == ans] / (2 if other == ans else 1)`` (a tie splits it evenly)."""
    one = jnp.ones((), x.dtype)
    # a select of 1/2, not a division by 2: the same values, and the round ran 2 % faster on one core
    return jnp.where(x == ans, jnp.where(other == ans, 0.5 * one, one), 0 * one)


@jax.custom_vjp
def pool_corners(x: jax.Array) -> jax.Array:
    """``max(max(a, b), max(c, d))`` of each 2x2 window's corners (even ``H`` and ``W``), with JAX's own
    gradient, bit for bit for any input without NaN (ties included), computed in one pass: the four corners'
    cotangents interleaved into ``[B, H, W, C]``. Differentiated as plain ``jnp.maximum`` calls, XLA's CPU
    backend fuses the four corners' zero-padded cotangents, summed, with the preceding layer's gradient, and
    that fusion took 14 % of the simple-CNN's training step (3.25 against 2.80 ms a step of 64,
    docs/benchmarks.md)."""
    a, b, c, d = _corners(x)
    return jnp.maximum(jnp.maximum(a, b), jnp.maximum(c, d))


def _pool_corners_forward(x):
    return pool_corners(x), x


def _larger(p: jax.Array, q: jax.Array) -> jax.Array:
    """``max(p, q)`` for inputs without NaN, as one comparison and a select. XLA's CPU ``maximum`` also
    propagates NaN, at several instructions an element; the backward pass recomputes the windows' maxima at
    every element of the layer before the pool, and that way the simple-CNN's FedAvg round ran 6 % slower on
    one core. A NaN input has already made the forward pass, so the loss, NaN."""
    return jnp.where(p > q, p, q)


def _pool_corners_backward(x, g):
    a, b, c, d = _corners(x)
    left, right = _larger(a, b), _larger(c, d)
    top = _larger(left, right)
    g_left, g_right = g * _max_share(left, top, right), g * _max_share(right, top, left)
    g_a, g_b = g_left * _max_share(a, left, b), g_left * _max_share(b, left, a)
    g_c, g_d = g_right * _max_share(c, right, d), g_right * _max_share(d, right, c)
    batch, h, w, channels = g.shape
    # out[:, 2i + r, 2j + s] is corner (r, s): a = (0, 0), b = (1, 0), c = (0, 1), d = (1, 1)
    out = jnp.stack([jnp.stack([g_a, g_c], axis=3), jnp.stack([g_b, g_d], axis=3)], axis=2)
    return (out.reshape(batch, 2 * h, 2 * w, channels),)


pool_corners.defvjp(_pool_corners_forward, _pool_corners_backward)


def im2col(x: jax.Array, kernel_size: tuple[int, int], padding: str | int, strides: tuple[int, int] = (1, 1)
           ) -> jax.Array:
    """``[B, H', W', kh*kw*C]`` patches of a convolution, built by (strided) slicing (rows ordered (kh, kw,
    C), matching a Flax ``Conv`` kernel ``[kh, kw, C, F]`` reshaped to ``[kh*kw*C, F]``)."""
    kh, kw = kernel_size
    sh, sw = strides
    x = pad_input(x, kernel_size, padding)
    out_h, out_w = (x.shape[1] - kh) // sh + 1, (x.shape[2] - kw) // sw + 1
    patches = [x[:, i:i + (out_h - 1) * sh + 1:sh, j:j + (out_w - 1) * sw + 1:sw, :]
               for i in range(kh) for j in range(kw)]
    return jnp.concatenate(patches, axis=-1)


def pad_input(x: jax.Array, kernel_size: tuple[int, int], padding: str | int) -> jax.Array:
    """``x`` padded so that a VALID convolution gives the ``padding`` one: ``'SAME'`` (stride-1 SAME),
    ``'VALID'``, or ``p`` zeros on every side (as ``nn.Conv(padding=p)``)."""
    if padding == "SAME":
        return same_padding(x, kernel_size)
    if isinstance(padding, int):
        return jnp.pad(x, ((0, 0), (padding, padding), (padding, padding), (0, 0)))
    return x


def input_padding(kernel_size: tuple[int, int], padding: str | int) -> Padding:
    """The ``(low, high)`` zeros :func:`pad_input` puts before and after the rows and the columns."""
    if padding == "SAME":
        return tuple(((k - 1) // 2, k // 2) for k in kernel_size)
    p = padding if isinstance(padding, int) else 0
    return (p, p), (p, p)


def same_padding(x: jax.Array, kernel_size: tuple[int, int]) -> jax.Array:
    """Zero-pads ``[B, H, W, C]`` so that a VALID stride-1 convolution gives XLA's SAME output."""
    kh, kw = kernel_size
    return jnp.pad(x, ((0, 0), ((kh - 1) // 2, kh // 2), ((kw - 1) // 2, kw // 2), (0, 0)))


def band_width(out_width: int, kw: int) -> int:
    """Output columns per band: the largest divisor of ``out_width`` not above ``kw`` (28 -> 4, 10 -> 5)."""
    return max(d for d in range(1, kw + 1) if out_width % d == 0)


def _blocks(span: int, wb: int) -> int:
    return -(-span // wb)  # ceil


def _row_slice(i: int, groups: int, hb: int) -> slice:
    """Input rows ``i, i + hb, ..., i + (groups - 1) hb``: row ``i`` of each band's ``hb + kh - 1``."""
    return slice(i, i + (groups - 1) * hb + 1, hb)


def _bands_one_slice_each(x: jax.Array, kh: int, kw: int, wb: int, hb: int = 1) -> jax.Array:
    """Band inputs ``[B, out_h / hb, bands, hb + kh - 1, span, C]`` as one slice of ``x`` per band and input
    row."""
    out_h, out_w = x.shape[1] - kh + 1, x.shape[2] - kw + 1
    span, groups = wb + kw - 1, out_h // hb
    return jnp.stack([jnp.stack([x[:, _row_slice(i, groups, hb), n * wb:n * wb + span]
                                 for n in range(out_w // wb)], 2)
                      for i in range(hb + kh - 1)], 3)


def _bands_whole_width(x: jax.Array, kh: int, kw: int, wb: int, hb: int = 1) -> jax.Array:
    """The same band inputs as ``ceil(span / wb)`` whole-width slices per input row, each reshaped into
    bands."""
    b, h, w, c = x.shape
    out_h, out_w = h - kh + 1, w - kw + 1
    bands, span, groups, rows_h = out_w // wb, wb + kw - 1, out_h // hb, hb + kh - 1
    blocks = _blocks(span, wb)
    # The last block may run past the input; the columns it reads there lie beyond ``span`` and are dropped.
    x = jnp.pad(x, ((0, 0), (0, 0), (0, (bands + blocks - 1) * wb - w), (0, 0)))
    rows = jnp.stack([jnp.stack([x[:, _row_slice(i, groups, hb), q * wb:(q + bands) * wb].reshape(
        b, groups, bands, wb, c) for q in range(blocks)], 3)
                      for i in range(rows_h)], 3)  # [B, groups, bands, rows_h, blocks, wb, C]
    return rows.reshape(b, groups, bands, rows_h, blocks * wb, c)[:, :, :, :, :span]


WIDE_FORWARD = 4  # the forward pass takes whole-width slices where bands > WIDE_FORWARD x blocks


def _forward_form(kh: int, kw: int, wb: int, bands: int):
    return _bands_whole_width if bands > WIDE_FORWARD * _blocks(wb + kw - 1, wb) else _bands_one_slice_each


@functools.partial(jax.custom_vjp, nondiff_argnums=(1, 2, 3, 4))
def band_rows(x: jax.Array, kh: int, kw: int, wb: int, hb: int = 1) -> jax.Array:
    """The inputs each band of ``hb`` output rows by ``wb`` output columns reads,
    ``[B, out_h / hb, bands, hb + kh - 1, wb + kw - 1, C]``: band ``(g, n)`` reads rows ``g hb .. g hb + hb
    + kh - 2`` and columns ``n wb .. n wb + span - 1``.

    Two constructions give the same values: one slice per band and input row (``(hb + kh - 1) x bands``
    slices), or ``ceil(span / wb)`` whole-width slices per input row, each reshaped into bands (a slice
    takes every ``hb``-th row of ``x``). Their gradients with
    respect to ``x`` (the transpose of the slices: shifted copies of the cotangent, summed) differ in cost,
    and so do their forward passes, so each pass takes its own:

    * the gradient takes the whole-width form wherever it has fewer copies (``bands > ceil(span / wb)``).
      XLA's CPU backend materialises the copies one by one wherever the gradient has several uses: FedCOG's
      generation step runs 1.9 to 3.2x faster than with one slice a band both ways, and the CNN3 and Feddle
      CNN training steps 2.8x and 1.5x (``benchmarks/banded_gradient.py``, docs/benchmarks.md);
    * the forward pass takes one slice per band unless the bands outnumber the blocks more than fourfold
      (Feddle's CNN: 10 to 14 bands of 2 blocks). The whole-width forward pass cost the simple-CNN's FedAvg
      round 1.2x (7 bands of 2 blocks, and 2 of 2); one slice a band cost Feddle's CNN's training step 1.2x.

    Where nothing asks for the input's gradient (a first layer in training) the backward pass is not
    computed at all.
    """
    return _forward_form(kh, kw, wb, (x.shape[2] - kw + 1) // wb)(x, kh, kw, wb, hb)


def _band_rows_forward(x, kh, kw, wb, hb):
    return band_rows(x, kh, kw, wb, hb), None


def _band_rows_backward(kh, kw, wb, hb, _, rows_cotangent):
    b, groups, bands, _, span, c = rows_cotangent.shape
    x = jax.ShapeDtypeStruct((b, groups * hb + kh - 1, bands * wb + kw - 1, c), rows_cotangent.dtype)
    form = _bands_whole_width if bands > _blocks(span, wb) else _bands_one_slice_each
    return jax.linear_transpose(functools.partial(form, kh=kh, kw=kw, wb=wb, hb=hb), x)(rows_cotangent)


band_rows.defvjp(_band_rows_forward, _band_rows_backward)


def _shift(span: int, width: int, taps: int) -> np.ndarray:
    """``S[v + j, v, j] = 1``: which of ``span`` inputs tap ``j`` of output ``v`` reads."""
    shift = np.zeros((span, width, taps), np.float32)
    for v in range(width):
        for j in range(taps):
            shift[v + j, v, j] = 1.0
    return shift


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3))
def banded_conv(x: jax.Array, kernel: jax.Array, band_height: int = 1,
                padding: Padding = ((0, 0), (0, 0))) -> jax.Array:
    """A stride-1 convolution of ``x`` zero-padded by ``padding``, as one matrix product against a
    block-Toeplitz ("banded") weight matrix.

    Output columns are taken ``wb`` at a time, and output rows ``hb = band_height`` at a time (1 where it
    does not divide the output's height). A row of the left operand holds the ``(hb + kh - 1) x (wb + kw -
    1) x C`` inputs one band needs (:func:`band_rows`, duplicating inputs ``(hb + kh - 1) (wb + kw - 1) /
    (hb wb)`` times, against im2col's ``kh kw``); the weight matrix ``T[(i, u, c), (r, v, o)] = kernel[i -
    r, u - v, c, o]`` (zero off the band) comes from a small einsum. XLA's CPU convolution is slow for the
    few channels of small CNNs; this lowering makes the simple-CNN step several times faster there
    (docs/benchmarks.md). Taller bands cut the duplicated inputs (the simple-CNN's first layer: 10x to 6x)
    for a product with more FLOPs (144 instead of 120 an output) but wider and shorter operands.

    The kernel's gradient is the product's transpose; the input's is either the band inputs' transpose or
    the transposed convolution (:func:`_banded_conv_backward`).
    """
    return _banded_forward(x, kernel, band_height, padding)[0]


def _pad(x: jax.Array, padding: Padding) -> jax.Array:
    """``[B, H, W, C]`` zero-padded by ``padding``; a negative amount crops."""
    zero = jnp.zeros((), x.dtype)
    return jax.lax.pad(x, zero, ((0, 0, 0), *((low, high, 0) for low, high in padding), (0, 0, 0)))


def _band_shape(out_h: int, out_w: int, kw: int, band_height: int) -> tuple[int, int]:
    """A band's output columns and rows, ``(wb, hb)``."""
    return band_width(out_w, kw), band_height if out_h % band_height == 0 else 1


def _toeplitz(kernel: jax.Array, wb: int, hb: int, transposed: bool = False) -> jax.Array:
    """The banded weight matrix ``[(hb + kh - 1) (wb + kw - 1) C, hb wb F]`` of :func:`banded_conv`, or its
    transpose."""
    kh, kw, c, features = kernel.shape
    span, rows_h = wb + kw - 1, hb + kh - 1
    inputs, outputs = ("iuc", "vo") if hb == 1 else ("iuc", "rvo")
    spec = outputs + inputs if transposed else inputs + outputs
    if hb == 1:
        toeplitz = jnp.einsum(f"uvj,ijco->{spec}", _shift(span, wb, kw), kernel)
    else:
        toeplitz = jnp.einsum(f"ira,uvj,ajco->{spec}", _shift(rows_h, hb, kh), _shift(span, wb, kw), kernel)
    shape = (rows_h * span * c, hb * wb * features)
    return toeplitz.reshape(shape[::-1] if transposed else shape)


def _banded_forward(x, kernel, band_height, padding):
    """:func:`banded_conv`'s outputs, and its band inputs ``[bands, inputs]`` for the kernel's gradient."""
    x = _pad(x, padding)
    b, h, w, _ = x.shape
    kh, kw, _, features = kernel.shape
    out_h, out_w = h - kh + 1, w - kw + 1
    wb, hb = _band_shape(out_h, out_w, kw, band_height)
    rows = band_rows(x, kh, kw, wb, hb)
    rows = rows.reshape(-1, np.prod(rows.shape[3:]))
    y = rows @ _toeplitz(kernel, wb, hb)  # [B, groups, bands, hb, wb, F] -> [B, groups, hb, bands, wb, F]
    y = y.reshape(b, out_h // hb, out_w // wb, hb, wb, features).transpose(0, 1, 3, 2, 4, 5)
    return y.reshape(b, out_h, out_w, features), (rows, kernel)


def _band_outputs(y: jax.Array, wb: int, hb: int) -> jax.Array:
    """``[B, H', W', F]`` outputs as the product's ``[bands, hb wb F]`` (the forward pass's arrangement,
    inverted)."""
    b, out_h, out_w, features = y.shape
    y = y.reshape(b, out_h // hb, hb, out_w // wb, wb, features).transpose(0, 1, 3, 2, 4, 5)
    return y.reshape(-1, hb * wb * features)


TRANSPOSED_GRADIENT = 10
"""The input's gradient is the transposed convolution where the band inputs' transpose sums more than this
many shifted copies of the input (BHerd's and FedAvg's second 5x5 layers on 14x14 inputs: 15)."""


def gradient_copies(out_width: int, kernel_size: tuple[int, int], wb: int, hb: int) -> int:
    """Shifted copies of the input the band inputs' transpose sums: ``(hb + kh - 1) min(bands, ceil(span /
    wb))`` (:func:`band_rows`' gradient takes the form with fewer)."""
    kh, kw = kernel_size
    return (hb + kh - 1) * min(out_width // wb, _blocks(wb + kw - 1, wb))


def _narrower_first(outputs: int, inputs: int) -> bool:
    """Whether the kernel's gradient multiplies the outputs' cotangent ``[bands, outputs]``, transposed, by
    the band inputs ``[bands, inputs]`` (else the inputs, transposed, by the outputs'). XLA's CPU product of
    two matrices contracted over their rows ran 1.3 to 3x faster with the narrower one first (a ``/tmp``
    probe on the Intel VM: ``[9800, 64]`` and ``[9800, 960]`` 14 against 28 ms, ``[19600, 40]`` and
    ``[19600, 128]`` 1.8 against 4.5 ms); BHerd's second layer's weight gradient had taken 20 ms of a 73 ms
    training step (``benchmarks/bherd_cnn_round.py --compare orientation``)."""
    return outputs < inputs


def _banded_conv_backward(band_height, padding, residuals, y_cotangent):
    """The kernel's cotangent: the band inputs' and the outputs' cotangent multiplied over the bands
    (:func:`_narrower_first`), through the banded matrix's einsum. The input's, either

    * the band inputs' transpose (:func:`band_rows`): ``(hb + kh - 1) min(bands, ceil(span / wb))`` shifted
      copies of the input, summed. XLA's CPU backend materialises them one by one and sums them again in each
      of the gradient's uses (in BHerd's CNN, the normalisation's and the pooling's gradients below the
      second convolution: 15 copies of ``[B, 18, 18, 32]``, each summed twice), so that with more than
      :data:`TRANSPOSED_GRADIENT` copies the input's gradient takes
    * the transposed convolution, ``dx[h] = sum_i dy[h + top - i] kernel[i]``: the outputs' cotangent padded
      by ``k - 1 - padding`` on each side, convolved (banded) with the kernel flipped and its channels
      swapped. BHerd's CNN's training step (B = 100, one core) ran 1.27x faster, its engine round 1.19x
      (``benchmarks/bherd_cnn_round.py --compare gradient``); with fewer copies it ran slower (Feddle's CNN,
      3x3 kernels and 6 copies: 1.3x).
    """
    rows, kernel = residuals
    kh, kw, channels, _ = kernel.shape
    b, out_h, out_w, _ = y_cotangent.shape
    wb, hb = _band_shape(out_h, out_w, kw, band_height)
    outputs = _band_outputs(y_cotangent, wb, hb)
    narrow_outputs = _narrower_first(outputs.shape[1], rows.shape[1])
    matrix, pull = jax.vjp(functools.partial(_toeplitz, wb=wb, hb=hb, transposed=narrow_outputs), kernel)
    kernel_cotangent, = pull(outputs.T @ rows if narrow_outputs else rows.T @ outputs)
    span, rows_h = wb + kw - 1, hb + kh - 1
    if gradient_copies(out_w, (kh, kw), wb, hb) > TRANSPOSED_GRADIENT:
        flipped = jnp.flip(kernel, (0, 1)).transpose(0, 1, 3, 2)
        transposed = tuple((k - 1 - low, k - 1 - high) for k, (low, high) in zip((kh, kw), padding))
        width = out_w + kw - 1 - sum(padding[1])
        return banded_conv(y_cotangent, flipped, default_band_height(band_width(width, kw), channels),
                           transposed), kernel_cotangent
    rows_cotangent = outputs @ (matrix if narrow_outputs else matrix.T)
    rows_cotangent = rows_cotangent.reshape(b, out_h // hb, out_w // wb, rows_h, span, channels)
    padded, = _band_rows_backward(kh, kw, wb, hb, None, rows_cotangent)
    return _pad(padded, tuple((-low, -high) for low, high in padding)), kernel_cotangent


banded_conv.defvjp(_banded_forward, _banded_conv_backward)


NARROW_BAND = 32
"""A band whose product has fewer outputs than this (``wb x F``) is narrow: it takes two rows of outputs."""


def default_band_height(width: int, features: int) -> int:
    """Output rows a band of ``width`` columns takes in a layer of ``features`` filters: 2 where the band's
    product would be narrow (``width x features`` below :data:`NARROW_BAND`), else 1.

    Measured in the engine's round on the 2-core Intel VM: the simple-CNN's FedAvg epoch round ran 1.05x
    faster on one core with bands of 2 rows in its first layer (4 columns x 6 filters), 1.10x split over both
    cores, and slower with 4. A bare training step of the zoo's other CNNs, whose first layers have 16 or 32
    filters, ran 0.97-1.01x with 2 rows, so they keep 1 (docs/benchmarks.md)."""
    return 2 if width * features < NARROW_BAND else 1


class Conv(nn.Module):
    """A 2-D convolution, ``[B, H, W, C] -> [B, H', W', features]``, with the parameters of ``nn.Conv``
    (``kernel [kh, kw, C, F]``, ``bias [F]``) and a choice of lowering:

    * ``'xla'``: ``lax.conv_general_dilated`` (XLA's convolution);
    * ``'im2col'``: patches by slicing, then one matrix product; inside a ``lax.scan`` body on CPU this is
      over 100 times faster than XLA's convolution for ResNet-18's 64-channel layers (docs/benchmarks.md);
    * ``'banded'``: :func:`banded_conv`, the fastest on CPU for small CNNs (stride 1; strided convolutions
      fall back to ``'im2col'``).

    ``padding``: ``'SAME'`` (stride 1 only, XLA's), ``'VALID'``, or ``p`` zeros on every side.
    ``band_height``: output rows a band of the banded lowering takes; ``None`` for
    :func:`default_band_height`.
    """

    features: int
    kernel_size: tuple[int, int]
    padding: str | int = "SAME"
    use_bias: bool = True
    lowering: ConvLowering = "xla"
    kernel_init: nn.initializers.Initializer = nn.linear.default_kernel_init
    bias_init: nn.initializers.Initializer = nn.initializers.zeros
    strides: tuple[int, int] = (1, 1)
    band_height: int | None = None

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        kh, kw = self.kernel_size
        if self.padding == "SAME" and self.strides != (1, 1):
            raise ValueError("Conv: padding 'SAME' is for stride 1; give the padding as a number of zeros")
        kernel = self.param("kernel", self.kernel_init, (kh, kw, x.shape[-1], self.features))
        if self.lowering == "banded" and self.strides == (1, 1):
            padding = input_padding(self.kernel_size, self.padding)
            width = band_width(x.shape[2] + sum(padding[1]) - kw + 1, kw)
            y = banded_conv(x, kernel, self.band_height or default_band_height(width, self.features), padding)
        elif self.lowering in ("im2col", "banded"):
            y = im2col(x, self.kernel_size, self.padding, self.strides) @ kernel.reshape(-1, self.features)
        else:
            padding = [(self.padding, self.padding)] * 2 if isinstance(self.padding, int) else self.padding
            y = jax.lax.conv_general_dilated(x, kernel, self.strides, padding,
                                             dimension_numbers=("NHWC", "HWIO", "NHWC"))
        if self.use_bias:
            y = y + self.param("bias", self.bias_init, (self.features,))
        return y


def local_response_norm(x: jax.Array, depth_radius: int = 4, bias: float = 1.0, alpha: float = 0.001 / 9,
                        beta: float = 0.75) -> jax.Array:
    """TensorFlow's ``tf.nn.local_response_normalization`` over the channel axis:
    ``x / (bias + alpha * sum_{|c'-c| <= r} x_{c'}^2) ** beta``.

    The window sum is one ``reduce_window`` over the channels, and ``beta = 0.75`` (TensorFlow's default, and
    BHerd's CNN) takes ``t^-3/4 = rsqrt(t) sqrt(rsqrt(t))`` in place of a power. On a CPU core a sum of
    shifted slices and a power made the two normalisations most of BHerd's CNN training step; with this form
    the engine's round of that CNN runs about 2x faster (``benchmarks/bherd_cnn_round.py``)."""
    lead = (1,) * (x.ndim - 1)
    window = jax.lax.reduce_window(jnp.square(x), 0.0, jax.lax.add, (*lead, 2 * depth_radius + 1), (*lead, 1),
                                   ((0, 0),) * len(lead) + ((depth_radius, depth_radius),))
    return x * _inverse_power(bias + alpha * window, beta)


def _inverse_power(t: jax.Array, exponent: float) -> jax.Array:
    """``t ** -exponent`` for positive ``t``, without a power where ``exponent`` is 0.75."""
    if exponent == 0.75:
        root = jax.lax.rsqrt(t)
        return root * jnp.sqrt(root)
    return t ** -exponent


class Normalization(nn.Module):
    """BatchNorm, GroupNorm or nothing, behind one interface.

    BatchNorm uses PyTorch's defaults (momentum 0.1, i.e. Flax ``momentum=0.9``; ``epsilon=1e-5``), batch
    statistics in training and running averages in evaluation; ``mask [B]`` keeps padded rows of a partial
    batch out of the statistics.
    """

    kind: Norm = "batch"
    groups: int = 2

    @nn.compact
    def __call__(self, x: jax.Array, train: bool, mask: jax.Array | None = None) -> jax.Array:
        if self.kind == "none":
            return x
        if self.kind == "group":
            return nn.GroupNorm(num_groups=self.groups, epsilon=1e-5)(x)
        mask = None if mask is None else mask.reshape((-1,) + (1,) * (x.ndim - 1)).astype(bool)
        if mask is not None:
            mask = jnp.broadcast_to(mask, x.shape)
        return nn.BatchNorm(use_running_average=not train, momentum=0.9, epsilon=1e-5)(x, mask=mask)


def flatten(x: jax.Array) -> jax.Array:
    """``[B, ...] -> [B, prod(...)]``."""
    return x.reshape((x.shape[0], -1))


def num_params(variables, collection: str = "params") -> int:
    """The number of scalars in a collection of Flax variables (all leaves for a plain pytree)."""
    tree = (variables.get(collection, {}) if isinstance(variables, dict) and "params" in variables
            else variables)
    return sum(int(p.size) for p in jax.tree.leaves(tree))


def check_stage(stage: str, stages: Sequence[str], model: str) -> None:
    """Raises ``ValueError`` naming the allowed split points when ``stage`` is not one of ``stages``."""
    if stage not in stages:
        raise ValueError(f"model.split: {model} has no stage {stage!r}; allowed: {list(stages)}")
