"""Everything that runs on an MPI rank and imports TensorFlow or Horovod."""
