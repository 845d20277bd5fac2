"""Log-mel spectrograms written with torch alone (no torchaudio).

The usual keyword-spotting front end (Warden 2018; the ZeroFL / FedL2P Speech
Commands setup): a short-time Fourier transform with a periodic Hann window,
the power spectrum, a bank of triangular filters equally spaced on the HTK mel
scale ``mel(f) = 2595 log10(1 + f / 700)``, then a natural log.
"""
from __future__ import annotations

import logging
import math

import torch

log = logging.getLogger(__name__)


def hz_to_mel(f):
    """HTK mel scale."""
    return 2595.0 * torch.log10(1.0 + torch.as_tensor(f, dtype=torch.float64) / 700.0)


def mel_to_hz(m):
    """Inverse of `hz_to_mel`."""
    return 700.0 * (10.0 ** (torch.as_tensor(m, dtype=torch.float64) / 2595.0) - 1.0)


def mel_filterbank(n_freqs: int, n_mels: int, sample_rate: int, f_min: float = 0.0,
                   f_max: float | None = None) -> torch.Tensor:
    """Triangular mel filters as an (n_freqs, n_mels) float64 matrix (no area normalization).

    Filter m rises linearly from edge m to its peak at edge m+1 and falls to zero at
    edge m+2, where the n_mels + 2 edges are equally spaced in mel between f_min and
    f_max; the FFT bins sit at ``k * sample_rate / (2 (n_freqs - 1))``.
    """
    f_max = sample_rate / 2.0 if f_max is None else float(f_max)
    if not 0.0 <= f_min < f_max <= sample_rate / 2.0:
        raise ValueError(f"need 0 <= f_min < f_max <= sample_rate / 2, got f_min={f_min}, f_max={f_max}")
    freqs = torch.linspace(0.0, sample_rate / 2.0, n_freqs, dtype=torch.float64)
    edges = mel_to_hz(torch.linspace(float(hz_to_mel(f_min)), float(hz_to_mel(f_max)), n_mels + 2,
                                     dtype=torch.float64))
    lower, center, upper = edges[:-2], edges[1:-1], edges[2:]
    rising = (freqs[:, None] - lower) / (center - lower)
    falling = (upper - freqs[:, None]) / (upper - center)
    fb = torch.clamp(torch.minimum(rising, falling), min=0.0)
    if (fb.max(dim=0).values == 0).any():
        # Too many filters for the frequency resolution: some fall between two FFT bins.
        log.warning("mel_filterbank: some of the %d filters are empty with %d frequency bins", n_mels, n_freqs)
    return fb


def log_mel_spectrogram(
    waveform: torch.Tensor,
    sample_rate: int,
    *,
    n_mels: int = 40,
    win_length: int | None = None,
    hop_length: int | None = None,
    n_fft: int | None = None,
    f_min: float = 0.0,
    f_max: float | None = None,
    eps: float = 1e-6,
) -> torch.Tensor:
    """``log(mel filterbank @ |STFT|^2 + eps)`` of waveforms (..., T) -> (..., n_mels, frames).

    Args:
        waveform: samples, typically in [-1, 1]; leading dimensions are batch. Float
            tensors keep their precision (float64 in, float64 out); others become float32.
        sample_rate: samples per second.
        n_mels: number of mel filters.
        win_length: Hann window length in samples (default 25 ms).
        hop_length: step between frames (default 10 ms).
        n_fft: FFT size (default the next power of two >= win_length); the window is
            zero-padded to n_fft, centered, as torch.stft does.
        f_min, f_max: band covered by the filters (default 0 .. sample_rate / 2).
        eps: added before the log so silence gives log(eps) instead of -inf.

    Frames are centered (the signal is reflect-padded by n_fft // 2 on both sides), so
    there are ``1 + T // hop_length`` of them.
    """
    win_length = int(win_length or round(0.025 * sample_rate))
    hop_length = int(hop_length or round(0.010 * sample_rate))
    n_fft = int(n_fft or 2 ** math.ceil(math.log2(win_length)))
    if not 0 < win_length <= n_fft or hop_length < 1:
        raise ValueError(f"need 0 < win_length <= n_fft and hop_length >= 1, got {win_length}, {n_fft}, {hop_length}")
    lead, length = waveform.shape[:-1], waveform.shape[-1]
    if length <= n_fft // 2:
        raise ValueError(f"waveforms of {length} samples are too short for n_fft={n_fft} (need > {n_fft // 2})")
    x = waveform.reshape(-1, length)
    x = x if x.is_floating_point() else x.float()
    window = torch.hann_window(win_length, periodic=True, dtype=x.dtype, device=x.device)
    spec = torch.stft(x, n_fft, hop_length=hop_length, win_length=win_length, window=window,
                      center=True, pad_mode="reflect", return_complex=True)
    power = spec.real**2 + spec.imag**2  # (B, n_fft // 2 + 1, frames)
    fb = mel_filterbank(n_fft // 2 + 1, n_mels, sample_rate, f_min, f_max).to(x.device, x.dtype)
    mel = torch.einsum("bft,fm->bmt", power, fb)
    return torch.log(mel + eps).reshape(*lead, n_mels, mel.shape[-1])
