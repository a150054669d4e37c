"""Exact resume of an interrupted `fit`: what Keras's and tf_keras's
`BackupAndRestore` lose, saved and restored (`_keras3`, `_tf_keras`), and
the state both share (`_state`: the host generators, a JSON codec that never
pickles, the checks a resume makes). Installed by the
`keras_backup_and_restore` patch; `tfdet.random_state(model)` is here too.
"""
