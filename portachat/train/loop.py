"""Old import path of the shared training loop; the code lives in portachat.train.trainer."""

from portachat.train.trainer import (  # noqa: F401 - re-exported
    BatchStream,
    Stage,
    StageData,
    TrainConfig,
    Trainer,
    TrainingError,
    TrainResult,
    train,
)
