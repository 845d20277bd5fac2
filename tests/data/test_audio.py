"""Log-mel features against an independent numpy computation; FSDD and Speech Commands loaders
on small wav folders written here in the published layouts."""
from __future__ import annotations

import os
import wave
from pathlib import Path

import numpy as np
import pytest
import torch

from pflkit.data.base import DatasetNotFoundError
from pflkit.data.datasets import load_dataset
from pflkit.data.sources.logmel import log_mel_spectrogram, mel_filterbank

SHARED = Path(os.environ.get("PFLKIT_DATA") or "/nonexistent-pflkit-data")  # CI sets $PFLKIT_DATA



# ---------------------------------------------------------------- independent reference


def numpy_mel_filterbank(n_freqs, n_mels, sr):
    """Triangles written point by point from the HTK mel definition."""
    mel = lambda f: 2595.0 * np.log10(1.0 + f / 700.0)  # noqa: E731
    hz = lambda m: 700.0 * (10.0 ** (m / 2595.0) - 1.0)  # noqa: E731
    edges = hz(np.linspace(mel(0.0), mel(sr / 2), n_mels + 2))
    freqs = np.arange(n_freqs) * sr / (2.0 * (n_freqs - 1))
    fb = np.zeros((n_freqs, n_mels))
    for m in range(n_mels):
        lo, mid, hi = edges[m : m + 3]
        for k, f in enumerate(freqs):
            if lo <= f <= mid:
                fb[k, m] = (f - lo) / (mid - lo)
            elif mid < f <= hi:
                fb[k, m] = (hi - f) / (hi - mid)
    return fb


def numpy_log_mel(x, sr, n_fft, win, hop, n_mels, eps=1e-6):
    """Frame by frame: reflect pad, centered periodic Hann, rfft, |.|^2, filterbank, log."""
    xp = np.pad(x, n_fft // 2, mode="reflect")
    window = np.zeros(n_fft)
    left = (n_fft - win) // 2
    window[left : left + win] = 0.5 - 0.5 * np.cos(2 * np.pi * np.arange(win) / win)
    n_frames = 1 + (len(xp) - n_fft) // hop
    frames = np.stack([xp[i * hop : i * hop + n_fft] * window for i in range(n_frames)])
    power = np.abs(np.fft.rfft(frames, axis=1)) ** 2
    return np.log(power @ numpy_mel_filterbank(n_fft // 2 + 1, n_mels, sr) + eps).T


def tone(sr, seconds, *freqs):
    t = np.arange(int(sr * seconds)) / sr
    return sum(0.4 * np.sin(2 * np.pi * f * t) for f in freqs)


def test_mel_filterbank_matches_pointwise_definition():
    fb = mel_filterbank(129, 40, 8000).numpy()
    np.testing.assert_allclose(fb, numpy_mel_filterbank(129, 40, 8000), atol=1e-12)
    assert fb.shape == (129, 40) and (fb.max(axis=0) > 0).all()


def test_log_mel_matches_numpy_in_float64_and_float32():
    sr = 8000
    x = tone(sr, 0.5, 1000.0, 2500.0)
    ref = numpy_log_mel(x, sr, n_fft=256, win=200, hop=80, n_mels=40)
    got64 = log_mel_spectrogram(torch.from_numpy(x), sr, n_mels=40, win_length=200, hop_length=80).numpy()
    assert got64.dtype == np.float64 and got64.shape == ref.shape == (40, 1 + len(x) // 80)
    np.testing.assert_allclose(got64, ref, atol=1e-7)
    got32 = log_mel_spectrogram(torch.from_numpy(x).float(), sr, n_mels=40, win_length=200, hop_length=80)
    assert got32.dtype == torch.float32
    # float32 round-off is relative to the loudest band: compare the powers, not their logs
    np.testing.assert_allclose(np.exp(got32.double().numpy()), np.exp(ref), atol=1e-5 * np.exp(ref).max())


def test_log_mel_peak_is_in_the_band_of_the_tone():
    sr, f0 = 16000, 1200.0
    feats = log_mel_spectrogram(torch.from_numpy(tone(sr, 1.0, f0)), sr, n_mels=40)  # defaults: 25 ms / 10 ms / 512
    assert feats.shape == (40, 101)
    fb = numpy_mel_filterbank(257, 40, sr)
    expected = int(np.argmax(fb[int(round(f0 * 512 / sr))]))
    assert (feats[:, 5:-5].argmax(dim=0) == expected).all()


def test_log_mel_batches_and_rejects_short_input():
    x = torch.from_numpy(tone(8000, 0.3, 700.0)).float()
    batch = torch.stack([x, 0.5 * x])
    out = log_mel_spectrogram(batch, 8000)
    torch.testing.assert_close(out[0], log_mel_spectrogram(x, 8000))
    # halving the amplitude scales the power by 1/4: log drops by log 4 where the signal dominates eps
    loud = out[0] > -2
    diff = out[0][loud] - out[1][loud]
    torch.testing.assert_close(diff, torch.full_like(diff, np.log(4.0)), atol=1e-3, rtol=0)
    with pytest.raises(ValueError, match="too short"):
        log_mel_spectrogram(torch.zeros(100), 8000)


# ---------------------------------------------------------------- wav folders


def write_wav(path: Path, samples: np.ndarray, sr: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(sr)
        w.writeframes(np.clip(samples * 32767, -32768, 32767).astype("<i2").tobytes())


def test_fsdd_folder(tmp_path):
    rec = tmp_path / "free-spoken-digit-dataset" / "recordings"
    clips = {}
    for speaker in ("bob", "alice"):
        for digit in (0, 1):
            for take in (0, 5, 7):
                seconds = 1.2 if (speaker, digit, take) == ("bob", 1, 7) else 0.3 + 0.05 * take
                clips[(speaker, digit, take)] = tone(8000, seconds, 300.0 + 200 * digit + (speaker == "bob") * 50)
                write_wav(rec / f"{digit}_{speaker}_{take}.wav", clips[(speaker, digit, take)], 8000)
    ds = load_dataset("fsdd", tmp_path)
    assert ds.x_train.shape == (8, 1, 40, 101) and ds.x_test.shape == (4, 1, 40, 101)
    assert ds.x_train.dtype == torch.float32 and ds.y_train.dtype == torch.int64
    assert ds.meta.group_names["speaker"] == ("alice", "bob") and ds.meta.class_names == tuple("0123456789")
    assert sorted(ds.y_test.tolist()) == [0, 0, 1, 1] and sorted(ds.groups_test["speaker"].tolist()) == [0, 0, 1, 1]
    assert abs(float(ds.x_train.mean())) < 1e-4 and abs(float(ds.x_train.std()) - 1) < 1e-4
    # every feature is the standardized log-mel of the clip, zero-padded (or middle-cropped) to 1 s
    order = sorted(clips)  # the loader's order: (speaker, digit, take)

    def raw(key):
        x = np.clip(clips[key] * 32767, -32768, 32767).astype(np.int16) / 32768.0  # as written
        x = x[(len(x) - 8000) // 2 :][:8000] if len(x) > 8000 else np.pad(x, (0, 8000 - len(x)))
        return log_mel_spectrogram(torch.from_numpy(x).float(), 8000, win_length=200, hop_length=80)

    train = torch.stack([raw(k) for k in order if k[2] >= 5])
    expected = (train - train.mean()) / train.std()
    torch.testing.assert_close(ds.x_train[:, 0], expected, atol=1e-4, rtol=1e-4)
    assert "recordings" in ds.meta.source


def test_fsdd_options_change_the_features(tmp_path):
    for take in (0, 9):
        write_wav(tmp_path / "recordings" / f"3_eve_{take}.wav", tone(8000, 0.5, 440.0), 8000)
    ds = load_dataset("fsdd", tmp_path, n_mels=20, hop_ms=20.0, duration=0.5)
    assert ds.x_train.shape == (1, 1, 20, 1 + 4000 // 160) and ds.meta.input_shape == (1, 20, 26)
    with pytest.raises(ValueError, match="n_mels"):
        load_dataset("fsdd", tmp_path, n_mels=0)


def test_speech_commands_folder(tmp_path):
    sc = tmp_path / "speech_commands_v0.02"
    files = {"yes/aaaa1111_nohash_0.wav": 0.5, "yes/bbbb2222_nohash_0.wav": 0.6, "no/aaaa1111_nohash_0.wav": 0.4,
             "no/cccc3333_nohash_1.wav": 0.5, "bed/dddd4444_nohash_0.wav": 0.5}
    for i, (rel, seconds) in enumerate(files.items()):
        write_wav(sc / rel, tone(16000, seconds, 400.0 + 100 * i), 16000)
    write_wav(sc / "_background_noise_" / "white_noise.wav", np.random.default_rng(0).uniform(-0.3, 0.3, 168000), 16000)
    (sc / "_background_noise_" / "README.md").write_text("noise")
    (sc / "validation_list.txt").write_text("no/cccc3333_nohash_1.wav\n")
    (sc / "testing_list.txt").write_text("yes/bbbb2222_nohash_0.wav\n")
    (sc / "LICENSE").write_text("CC BY 4.0")
    ds = load_dataset("speech_commands", tmp_path)
    assert ds.meta.num_classes == 12 and ds.meta.class_names[:3] == ("yes", "no", "up")
    assert ds.meta.class_names[10:] == ("_unknown_", "_silence_")
    # 10 one-second noise chunks: 1 to test, 1 to validation, 8 to train
    assert ds.x_train.shape == (4 + 9, 1, 40, 101) and ds.x_test.shape == (1 + 1, 1, 40, 101)
    assert sorted(ds.y_test.tolist()) == [0, 11]
    assert np.bincount(ds.y_train.numpy(), minlength=12).tolist() == [1, 2] + [0] * 8 + [1, 9]
    names = ds.meta.group_names["speaker"]
    assert set(names) == {"aaaa1111", "bbbb2222", "cccc3333", "dddd4444", "_silence_/white_noise"}
    speakers_of_no = sorted(names[s] for s in ds.groups_train["speaker"][ds.y_train.numpy() == 1])
    assert speakers_of_no == ["aaaa1111", "cccc3333"]
    split = ds.groups_train["official_split"]
    assert ds.meta.group_names["official_split"] == ("train", "validation", "test")
    assert sorted(ds.y_train.numpy()[split == 1].tolist()) == [1, 11]  # no/cccc3333 and one noise chunk
    assert (ds.groups_test["official_split"] == 2).all()


def test_missing_audio_datasets_name_the_searched_paths(tmp_path):
    for name, folder in (("fsdd", "recordings"), ("speech_commands", "speech_commands_v0.02")):
        with pytest.raises(DatasetNotFoundError) as err:
            load_dataset(name, tmp_path, download=True)  # PFLKIT_OFFLINE=1 (fixture): no network attempt
        msg = str(err.value)
        assert repr(name) in msg and str(tmp_path / folder) in msg and "downloads are disabled" in msg


@pytest.mark.skipif(not (SHARED / "fsdd.npz").is_file(), reason=f"shared FSDD npz not found in {SHARED}")
def test_fsdd_npz_from_shared_data():
    ds = load_dataset("fsdd", SHARED)
    assert ds.x_train.shape == (2700, 1, 40, 101) and ds.x_test.shape == (300, 1, 40, 101)
    assert len(ds.meta.group_names["speaker"]) == 6 and "george" in ds.meta.group_names["speaker"]
    # official split: takes 0-4 of each (speaker, digit) -> 5 x 10 = 50 test clips per speaker
    assert np.bincount(ds.groups_test["speaker"]).tolist() == [50] * 6
    assert np.bincount(ds.y_test.numpy()).tolist() == [30] * 10
    assert ds.meta.source.startswith(str(SHARED / "fsdd.npz"))
