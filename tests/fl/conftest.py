"""What the engine tests share: four digit clients of uneven sizes."""
from pflkit.fl.federate import build_federation
from tests.helpers_data import digits_dataset


def uneven_clients():
    """3 classes per client: 226 / 293 / 286 / 345 train images, so at batch 16 the clients take 15 / 19 / 18 / 22
    steps an epoch and their last batches differ in size."""
    return build_federation(digits_dataset(600), "pathological", 4, seed=0, classes_per_client=3)
