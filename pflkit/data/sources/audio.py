"""Spoken-word datasets as log-mel features: FSDD and Speech Commands v2 (12 classes).

Both are read into one npz schema of raw audio (int16 clips concatenated in
``audio``, clip i is ``audio[offsets[i]:offsets[i + 1]]``) plus per-clip labels
and speakers; features are computed at load time, so the feature options can
change without re-reading any file. Features: every clip is cut or zero-padded
to ``duration`` seconds, turned into a log-mel spectrogram (`logmel.py`), and
standardized with the mean and std of the training features (one scalar each),
giving float32 (N, 1, n_mels, frames) with ``meta.mean = 0``, ``meta.std = 1``.
"""
from __future__ import annotations

import re
import wave
from pathlib import Path
from typing import Sequence

import numpy as np
import torch

from ..base import Dataset, DatasetMeta, data_roots
from ..download import fetcher
from ..provenance import file_record, folder_record
from .common import Found, check_labels, check_positive_int, first_match, names_array, resolve
from .logmel import log_mel_spectrogram, mel_filterbank  # noqa: F401  (re-exported)

FSDD_RATE = 8000
FSDD_NAME = re.compile(r"^(\d)_([A-Za-z0-9]+)_(\d+)\.wav$")

SC_WORDS = ("yes", "no", "up", "down", "left", "right", "on", "off", "stop", "go")
SC_CLASSES = SC_WORDS + ("_unknown_", "_silence_")
SC_RATE = 16000
SC_SPLITS = ("train", "validation", "test")
SC_NOISE = "_background_noise_"
SC_LISTS = ("validation_list.txt", "testing_list.txt")
SC_SILENCE_SEED = 0
SC_SILENCE_FRACTION = 0.1  # of the 1 s noise chunks, to validation and to test each (as for the words)

HOW_SC = (
    "Extract speech_commands_v0.02.tar.gz (http://download.tensorflow.org/data/speech_commands_v0.02.tar.gz, "
    "Warden 2018) into <data root>/speech_commands_v0.02/ (torchaudio's "
    "SpeechCommands/speech_commands_v0.02/ also works), or put speech_commands.npz there."
)
HOW_FSDD = (
    "Clone or download https://github.com/Jakobovski/free-spoken-digit-dataset and put it in a data root "
    "(free-spoken-digit-dataset/recordings/<digit>_<speaker>_<take>.wav, or just recordings/), "
    "or put fsdd.npz there."
)


# ---------------------------------------------------------------- wav files


def read_wav(path: Path) -> tuple[np.ndarray, int]:
    """A PCM wav file as int16 samples (channels averaged) and its sample rate."""
    with wave.open(str(path), "rb") as w:
        width, channels, rate = w.getsampwidth(), w.getnchannels(), w.getframerate()
        raw = w.readframes(w.getnframes())
    if width == 1:  # 8-bit wav is unsigned
        x = (np.frombuffer(raw, np.uint8).astype(np.int32) - 128) << 8
    elif width == 2:
        x = np.frombuffer(raw, "<i2").astype(np.int32)
    elif width == 4:
        x = np.frombuffer(raw, "<i4").astype(np.int64) >> 16
    else:
        raise ValueError(f"{path}: {8 * width}-bit samples are not supported")
    x = x.reshape(-1, channels).mean(axis=1) if channels > 1 else x
    return np.asarray(x).astype(np.int16), rate


def read_clips(paths: Sequence[Path], rate: int, tail: Sequence[np.ndarray] = ()) -> tuple[np.ndarray, np.ndarray]:
    """Concatenated int16 samples and offsets of many wav files at ``rate`` Hz, then the ``tail`` clips.

    Sizes the output from the headers first so a large corpus is never held twice.
    """
    lengths = []
    for p in paths:
        with wave.open(str(p), "rb") as w:
            lengths.append(w.getnframes())
    lengths += [len(t) for t in tail]
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    audio = np.empty(int(offsets[-1]), np.int16)
    for i, p in enumerate(paths):
        x, r = read_wav(p)
        if r != rate:
            raise ValueError(f"{p} is sampled at {r} Hz, expected {rate} Hz")
        audio[offsets[i] : offsets[i] + len(x)] = x
    for i, t in enumerate(tail, start=len(paths)):
        audio[offsets[i] : offsets[i + 1]] = t
    return audio, offsets


# ---------------------------------------------------------------- features


def fixed_length(audio: np.ndarray, offsets: np.ndarray, index: np.ndarray, n_samples: int) -> torch.Tensor:
    """Clips as float32 (len(index), n_samples) in [-1, 1]: longer clips keep their middle,
    shorter ones are zero-padded at the end."""
    out = np.zeros((len(index), n_samples), np.float32)
    for row, i in enumerate(index):
        clip = audio[offsets[i] : offsets[i + 1]]
        if len(clip) > n_samples:
            start = (len(clip) - n_samples) // 2
            clip = clip[start : start + n_samples]
        out[row, : len(clip)] = clip
    return torch.from_numpy(out / 32768.0)


def clip_features(audio, offsets, index, rate: int, *, duration: float, n_mels: int, win_ms: float,
                  hop_ms: float, batch: int = 512) -> torch.Tensor:
    """Log-mel features (len(index), 1, n_mels, frames) of the selected clips."""
    n_samples = int(round(duration * rate))
    kw = dict(n_mels=n_mels, win_length=int(round(win_ms * rate / 1000)), hop_length=int(round(hop_ms * rate / 1000)))
    frames = 1 + n_samples // kw["hop_length"]
    out = torch.empty((len(index), 1, n_mels, frames), dtype=torch.float32)
    for s in range(0, len(index), batch):
        wav = fixed_length(audio, offsets, index[s : s + batch], n_samples)
        out[s : s + batch, 0] = log_mel_spectrogram(wav, rate, **kw)
    return out


def log_mel_options(duration, n_mels, win_ms, hop_ms) -> dict:
    """The log-mel settings of every audio loader, checked (ValueError naming the key), as a dict.

    Args:
        duration: seconds each clip is cut (keeping its middle) or zero-padded to.
        n_mels: number of mel filters.
        win_ms, hop_ms: STFT window and hop in milliseconds.
    """
    check_positive_int("n_mels", n_mels)
    for key, value in (("duration", duration), ("win_ms", win_ms), ("hop_ms", hop_ms)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
            raise ValueError(f"{key} must be a positive number, got {value!r}")
    if win_ms > 1000 * duration:
        raise ValueError(f"win_ms={win_ms} is longer than the clip duration {duration} s")
    return dict(duration=duration, n_mels=n_mels, win_ms=win_ms, hop_ms=hop_ms)


def audio_dataset(name: str, found: Found, y: np.ndarray, is_test: np.ndarray, class_names: Sequence[str],
                  groups: dict[str, np.ndarray], group_names: dict[str, Sequence[str]],
                  feature_options: dict) -> Dataset:
    """Standardized log-mel `Dataset` from raw-audio arrays and per-clip labels / groups."""
    a = found.arrays
    check_labels(name, found.source, len(class_names), labels=y)
    rate = int(a["sample_rate"])
    train, test = np.flatnonzero(~is_test), np.flatnonzero(is_test)
    x_train = clip_features(a["audio"], a["offsets"], train, rate, **feature_options)
    x_test = clip_features(a["audio"], a["offsets"], test, rate, **feature_options)
    if len(train):  # standardize with training statistics only (no test leakage)
        mean, std = x_train.mean(), x_train.std().clamp_min(1e-8)
        x_train.sub_(mean).div_(std)  # in place: Speech Commands features take about 1.7 GB
        x_test.sub_(mean).div_(std)
    meta = DatasetMeta(
        name=name, num_classes=len(class_names), class_names=tuple(class_names),
        input_shape=tuple(x_train.shape[1:]), mean=(0.0,), std=(1.0,),
        group_names={k: tuple(str(n) for n in v) for k, v in group_names.items()},
        source=f"{found.source}; log-mel {feature_options}", files=found.files, download=found.download,
    )
    y = np.asarray(y, np.int64)
    return Dataset(meta, x_train, torch.from_numpy(y[train]), x_test, torch.from_numpy(y[test]),
                   {k: np.asarray(g, np.int64)[train] for k, g in groups.items()},
                   {k: np.asarray(g, np.int64)[test] for k, g in groups.items()})


# ---------------------------------------------------------------- FSDD


def _read_fsdd_folder(folder: Path) -> dict[str, np.ndarray]:
    entries = []
    for p in folder.iterdir():
        m = FSDD_NAME.match(p.name)
        if m:
            entries.append((m.group(2), int(m.group(1)), int(m.group(3)), p))
    if not entries:
        raise ValueError(f"{folder} holds no <digit>_<speaker>_<take>.wav files")
    entries.sort()
    speakers = sorted({e[0] for e in entries})
    audio, offsets = read_clips([e[3] for e in entries], FSDD_RATE)
    take = np.asarray([e[2] for e in entries], np.int64)
    return {
        "audio": audio, "offsets": offsets,
        "digit": np.asarray([e[1] for e in entries], np.int64),
        "speaker": np.asarray([speakers.index(e[0]) for e in entries], np.int64),
        "take": take, "is_test": take < 5, "speaker_names": names_array(speakers),
        "sample_rate": np.asarray(FSDD_RATE, np.int64),
    }


def _fsdd_folder_ok(p: Path) -> bool:
    return p.is_dir() and any(FSDD_NAME.match(f.name) for f in p.iterdir())


def read_fsdd(roots: Sequence[Path], *, download: bool = False, use_npz: bool = True) -> Found:
    """FSDD raw-audio arrays: ``fsdd.npz``, else a ``recordings/`` folder of wavs, else a download
    of the GitHub archive at a fixed tag (`pflkit.data.download.RESOURCES`) into the cache."""
    rels = ("free-spoken-digit-dataset/recordings", "free-spoken-digit-dataset-master/recordings", "recordings")
    return resolve("fsdd", roots, npz_files=("fsdd.npz",), find_raw=lambda rs: first_match(rs, rels, _fsdd_folder_ok),
                   read_raw=_read_fsdd_folder, how=HOW_FSDD, fetch=fetcher("fsdd"), download=download,
                   use_npz=use_npz, files_of=lambda f: [folder_record(f, (".wav",))])


def load_fsdd(root=None, *, download: bool = False, duration: float = 1.0, n_mels: int = 40,
              win_ms: float = 25.0, hop_ms: float = 10.0) -> Dataset:
    """Free Spoken Digit Dataset as standardized log-mel features (N, 1, n_mels, frames).

    The official split: takes 0-4 of every (speaker, digit) are the test set. Group
    ``speaker`` per clip. At 8 kHz with the defaults (1 s, 25 ms window, 10 ms hop)
    a clip gives 40 x 101 features.

    Args:
        root: data root searched first (then ``$PFLKIT_DATA``, then ``~/.cache/pflkit/data``).
        download: download the archive (GitHub tag, no published checksum) into the cache
            when no copy is found.
        duration, n_mels, win_ms, hop_ms: the log-mel features (`log_mel_options`).
    """
    opts = log_mel_options(duration, n_mels, win_ms, hop_ms)
    found = read_fsdd(data_roots(root), download=download)
    a = found.arrays
    is_test = np.asarray(a["is_test"], bool) if "is_test" in a else np.asarray(a["take"]) < 5
    return audio_dataset("fsdd", found, a["digit"], is_test, [str(d) for d in range(10)],
                         {"speaker": a["speaker"]}, {"speaker": [str(s) for s in a["speaker_names"]]}, opts)



# ---------------------------------------------------------------- Speech Commands v2


def _silence_chunks(noise_dir: Path) -> tuple[list[np.ndarray], list[str], list[int]]:
    """1 s chunks of every background-noise wav, their pseudo-speaker and split (seeded)."""
    chunks, speakers, splits = [], [], []
    rng = np.random.default_rng(SC_SILENCE_SEED)
    for p in sorted(noise_dir.glob("*.wav")) if noise_dir.is_dir() else []:
        x, rate = read_wav(p)
        if rate != SC_RATE:
            raise ValueError(f"{p} is sampled at {rate} Hz, expected {SC_RATE} Hz")
        n = len(x) // SC_RATE
        k = int(round(n * SC_SILENCE_FRACTION))
        split = np.zeros(n, np.int64)
        perm = rng.permutation(n)
        split[perm[:k]], split[perm[k : 2 * k]] = 2, 1
        chunks += [x[i * SC_RATE : (i + 1) * SC_RATE] for i in range(n)]
        speakers += [f"_silence_/{p.stem}"] * n
        splits += split.tolist()
    return chunks, speakers, splits


def _read_sc_folder(folder: Path) -> dict[str, np.ndarray]:
    validation, testing = ({ln.strip() for ln in (folder / f).read_text().splitlines() if ln.strip()} for f in SC_LISTS)
    paths, labels, speakers, splits = [], [], [], []
    for word in sorted(p for p in folder.iterdir() if p.is_dir() and not p.name.startswith("_")):
        label = SC_WORDS.index(word.name) if word.name in SC_WORDS else SC_CLASSES.index("_unknown_")
        for wav in sorted(word.glob("*.wav")):
            rel = f"{word.name}/{wav.name}"
            paths.append(wav)
            labels.append(label)
            speakers.append(wav.name.split("_nohash_")[0])
            splits.append(2 if rel in testing else 1 if rel in validation else 0)
    chunks, noise_speakers, noise_splits = _silence_chunks(folder / SC_NOISE)
    audio, offsets = read_clips(paths, SC_RATE, tail=chunks)
    speakers += noise_speakers
    names = sorted(set(speakers))
    index = {n: i for i, n in enumerate(names)}
    return {
        "audio": audio, "offsets": offsets,
        "label": np.asarray(labels + [SC_CLASSES.index("_silence_")] * len(chunks), np.int64),
        "speaker": np.asarray([index[s] for s in speakers], np.int64), "speaker_names": names_array(names),
        "split": np.asarray(splits + noise_splits, np.int64),
        "class_names": names_array(SC_CLASSES), "sample_rate": np.asarray(SC_RATE, np.int64),
    }


def read_speech_commands(roots: Sequence[Path], *, download: bool = False, use_npz: bool = True) -> Found:
    """Speech Commands raw-audio arrays: ``speech_commands.npz``, else the published folders."""
    rels = ("speech_commands_v0.02", "SpeechCommands/speech_commands_v0.02", "speech_commands")
    ok = lambda p: p.is_dir() and all((p / f).is_file() for f in SC_LISTS)  # noqa: E731
    return resolve("speech_commands", roots, npz_files=("speech_commands.npz",),
                   find_raw=lambda rs: first_match(rs, rels, ok), read_raw=_read_sc_folder, how=HOW_SC,
                   fetch=fetcher("speech_commands"), download=download, use_npz=use_npz,
                   files_of=lambda f: [folder_record(f, (".wav",)), *(file_record(f / n) for n in SC_LISTS)])


def load_speech_commands(root=None, *, download: bool = False, duration: float = 1.0, n_mels: int = 40,
                         win_ms: float = 25.0, hop_ms: float = 10.0) -> Dataset:
    """Speech Commands v2, 12-class version, as standardized log-mel features (N, 1, n_mels, frames).

    Classes: the ten words yes .. go, ``_unknown_`` (every other word) and ``_silence_``
    (1 s chunks of the ``_background_noise_`` recordings, 10% of each file's chunks to
    validation and 10% to test with a fixed seed; their pseudo-speaker is
    ``_silence_/<file>``). Official split lists: ``testing_list.txt`` is the test set;
    ``validation_list.txt`` stays in the training tensors, marked by the group
    ``official_split`` (0 train, 1 validation, 2 test), so federations can rebuild it.
    Group ``speaker`` (the hash before ``_nohash_``). 16 kHz; with the defaults a clip
    gives 40 x 101 features. The full corpus (105,829 clips) needs about 3.4 GB for
    the raw audio plus 1.7 GB for the features.

    Args:
        root: data root searched first (then ``$PFLKIT_DATA``, then ``~/.cache/pflkit/data``).
        download: download speech_commands_v0.02.tar.gz (about 2.3 GB) into the cache when
            no copy is found.
        duration, n_mels, win_ms, hop_ms: the log-mel features (`log_mel_options`).
    """
    opts = log_mel_options(duration, n_mels, win_ms, hop_ms)
    found = read_speech_commands(data_roots(root), download=download)
    a = found.arrays
    split = np.asarray(a["split"], np.int64)
    return audio_dataset(
        "speech_commands", found, a["label"], split == 2, [str(c) for c in a["class_names"]],
        {"speaker": a["speaker"], "official_split": split},
        {"speaker": [str(s) for s in a["speaker_names"]], "official_split": SC_SPLITS}, opts,
    )
